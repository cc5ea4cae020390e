"""A job whose Python environment has another Ray than the cluster's is refused with both
versions (spec/rayenv.py): at submit for what the submitter can read, at start (the runner's
pipcheck on the head) for what only a node can tell. The environments here are real venvs and
real Python processes; the "other Ray" in them is a distribution record (what importlib.metadata
and pip read), so no second Ray of 300 MB is installed (the testbed's Ray-range test runs a
real one: tests/testbed/test_ray_range.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raystack.allocation.runner import pipcheck
from raystack.errors import ConfigError
from raystack.spec import rayenv
from raystack.spec.load import command_spec
from raystack.spec.resolve import resolve
from raystack.store.cluster import ClusterRecord

CLUSTER = ClusterRecord(name="c", nodes_expected=1, cpus_per_node=4, ray_version="2.60.0")


def venv(where: Path, ray: str | None) -> Path:
    """A venv (no pip) whose Python has Ray `ray` as far as package metadata says, or none."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    if ray is not None:
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info = Path(site) / f"ray-{ray}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ray\nVersion: {ray}\n")
    return python


@pytest.mark.parametrize(
    ("renv", "refused"),
    [
        (
            {"pip": ["ray==2.55.0"]},
            "runtime_env.pip: ray==2.55.0 asks for another Ray than the cluster's (2.60.0)",
        ),
        ({"pip": ["torch", "ray[default]>=2.52,<2.61"]}, None),
        ({"pip": ["ray"]}, None),  # (unpinned: the cluster's Ray satisfies it)
        ({"uv": {"packages": ["ray[default]<2.55"]}}, "runtime_env.uv: ray[default]<2.55 asks"),
        (
            {"conda": {"dependencies": ["python=3.11", {"pip": ["ray[default]==2.52.0"]}]}},
            "runtime_env.conda (pip): ray[default]==2.52.0 asks",
        ),
        ({"pip": ["--no-index", "rayx==1.0", "-r reqs.txt"]}, None),
    ],
)
def test_a_ray_requirement_the_clusters_ray_does_not_meet_is_refused(renv: dict, refused: str | None) -> None:
    why = rayenv.pinned_fault(renv, "2.60.0")
    assert (why is None) if refused is None else (why is not None and why.startswith(refused)), why


def test_a_uv_projects_locked_ray_is_checked_for_a_job_run_with_uv_run(tmp_path: Path) -> None:
    (tmp_path / "uv.lock").write_text(
        'version = 1\n\n[[package]]\nname = "numpy"\nversion = "2.1.0"\n\n'
        '[[package]]\nname = "ray"\nversion = "2.55.0"\nsource = { registry = "https://x/simple" }\n'
    )
    spec = command_spec(["uv", "run", "train.py"])
    with pytest.raises(ConfigError, match=r"uv\.lock locks Ray 2\.55\.0 and the cluster runs Ray 2\.60\.0"):
        resolve(spec, CLUSTER, tmp_path, "command", submit_dir=tmp_path)
    assert resolve(command_spec(["python", "train.py"]), CLUSTER, tmp_path, "command", submit_dir=tmp_path)
    same = CLUSTER.model_copy(update={"ray_version": "2.55.0"})
    assert resolve(spec, same, tmp_path, "command", submit_dir=tmp_path).entrypoint == "uv run train.py"


def test_a_py_executable_with_another_ray_or_none_is_refused_at_submit_naming_both(tmp_path: Path) -> None:
    other, bare = venv(tmp_path / "other", "2.55.0"), venv(tmp_path / "bare", None)
    for python, has in ((other, "has Ray 2.55.0"), (bare, "has no Ray")):
        spec = command_spec(["python", "x.py"], sets=[f"runtime_env.py_executable={python}"])
        with pytest.raises(ConfigError) as refused:
            resolve(spec, CLUSTER, tmp_path, "command")
        said = str(refused.value)
        assert said.startswith(f"command: runtime_env.py_executable: {python} {has}"), said
        assert " and the cluster runs Ray 2.60.0: " in said, said
        assert "install ray[default]==2.60.0 there" in said
    fine = venv(tmp_path / "fine", "2.60.0")
    spec = command_spec(["python", "x.py"], sets=[f"runtime_env.py_executable={fine} -X faulthandler"])
    assert resolve(spec, CLUSTER, tmp_path, "command").runtime_env["py_executable"].startswith(str(fine))
    # (a program that is not a file here is the node's to judge; a launcher is not asked)
    for value in ("/nodes/only/bin/python", "uv run --with torch", ".venv/bin/python"):
        assert rayenv.executable_fault(value, "2.60.0", here=True) is None


def test_the_head_refuses_a_py_executable_or_a_conda_env_with_another_ray_at_start(tmp_path: Path) -> None:
    """What the submitter could not see: a python found by name on the nodes' PATH, a conda
    environment by name (under the base of the conda that Ray runs)."""
    other = venv(tmp_path / "bin-dir", "2.52.0")
    env = {"PATH": f"{other.parent}:/usr/bin:/bin"}
    why = pipcheck.check({"py_executable": "python"}, env=env)
    assert why is not None and why.startswith(
        f"runtime_env.py_executable: python has Ray 2.52.0 and the cluster runs Ray {rayenv.installed()}"
    ), why
    base = tmp_path / "conda"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "conda").write_text("#!/bin/sh\nexit 0\n")
    (base / "bin" / "conda").chmod(0o755)
    venv(base / "envs" / "rl", "2.55.0")
    why = pipcheck.check({"conda": "rl"}, env={"RAY_CONDA_HOME": str(base), "PATH": "/usr/bin:/bin"})
    assert why is not None and why.startswith(
        f"runtime_env.conda: environment rl ({base}/envs/rl) has Ray 2.55.0 and the cluster runs Ray"
    ), why
    mine = venv(tmp_path / "mine", rayenv.installed())
    assert pipcheck.check({"py_executable": str(mine)}, env=env) is None
    assert pipcheck.check({"conda": "not-here"}, env={"RAY_CONDA_HOME": str(base)}) is None  # (Ray says)
