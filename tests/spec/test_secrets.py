"""Secrets never travel with a working_dir: the cluster folder (tokens) is refused, and files
named token, ssh keys, certificates and keys are excluded the way Ray will package the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec import workdir
from raystack.spec.load import command_spec
from raystack.spec.resolve import resolve
from raystack.spec.workdir import DEFAULT_EXCLUDES
from raystack.store.cluster import ClusterRecord

CLUSTER = ClusterRecord(name="c", nodes_expected=1, gpus_per_node=0, cpus_per_node=4)


def test_a_working_dir_holding_raystack_home_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "repo" / ".raystack"
    (home / "clusters" / "c").mkdir(parents=True)
    (home / "clusters" / "c" / "token").write_text("secret")
    monkeypatch.setenv("RAYSTACK_HOME", str(home))
    spec = command_spec(["python", "x.py"], sets=[f"working_dir={tmp_path / 'repo'}"])
    with pytest.raises(ConfigError, match="holds RAYSTACK_HOME"):
        resolve(spec, CLUSTER, tmp_path, "command")
    # RAYSTACK_HOME itself as the working_dir: refused too; a sibling folder is fine.
    spec = command_spec(["python", "x.py"], sets=[f"working_dir={home}"])
    with pytest.raises(ConfigError, match="holds RAYSTACK_HOME"):
        resolve(spec, CLUSTER, tmp_path, "command")
    # A cluster's own folder (or the folder of them all): refused, naming where it is; another
    # folder kept in RAYSTACK_HOME is the user's.
    (home / "clusters" / "c" / "logs").mkdir()
    for inside in (home / "clusters" / "c", home / "clusters", home / "clusters" / "c" / "logs"):
        spec = command_spec(["python", "x.py"], sets=[f"working_dir={inside}"])
        with pytest.raises(ConfigError, match="is in RAYSTACK_HOME's clusters folder"):
            resolve(spec, CLUSTER, tmp_path, "command")
    (home / "lib").mkdir()
    spec = command_spec(["python", "x.py"], sets=[f"working_dir={home / 'lib'}"])
    assert resolve(spec, CLUSTER, tmp_path, "command").working_dir == str(home / "lib")
    (tmp_path / "other").mkdir()
    spec = command_spec(["python", "x.py"], sets=[f"working_dir={tmp_path / 'other'}"])
    assert resolve(spec, CLUSTER, tmp_path, "command").working_dir == str(tmp_path / "other")


def test_secret_files_are_never_uploaded(tmp_path: Path) -> None:
    for name in (
        "train.py",
        "token",
        "sub/token",
        ".ssh/id_ed25519",
        "certs/ca.pem",
        "tls/node.key",
        "auth_token",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    files = set(workdir.scan(tmp_path, DEFAULT_EXCLUDES).files)
    assert files == {"train.py"}, files
