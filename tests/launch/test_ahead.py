"""Which submitted jobs the queue runner asks the head's launch host to start at once
(launch/ahead.py), and how the request reaches a host that listens. The start itself, the
driver's adoption and what no driver took run on the testbed (tests/testbed/test_spmd.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from raystack.launch import ahead, pool
from raystack.store.files import listen

SPMD = "exec 3>&-; python -m raystack.launch.spmd --launcher=torchrun -- train.py"


@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, threading.Event]:
    """A node temp folder whose pipe someone reads (as the head's launch host does)."""
    heard = threading.Event()
    assert listen(str(tmp_path / pool.WAKE), heard.set, "test-ahead")
    return tmp_path, heard


def ask(folder: Path, sid: str = "j1-a", entrypoint: str = SPMD, **options: object) -> bool:
    return ahead.ask(sid, entrypoint, {"runtime_env": {"env_vars": {}}, **options}, str(folder))


def test_an_spmd_job_is_asked_for_and_its_host_hears_it(host: tuple[Path, threading.Event]) -> None:
    folder, heard = host
    assert ask(folder)
    assert heard.wait(5)
    request = folder / pool.REQUESTS / "j1-a"
    assert request.exists() and oct(request.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    ("sid", "entrypoint", "options", "env"),
    [
        ("j1-a", "python train.py", {}, {}),  # (not an SPMD driver)
        ("j1-a", SPMD, {}, {"RAYSTACK_PIN_NODES": "abc"}),  # (packed on its own nodes)
        ("j1-a", SPMD, {}, {"RAYSTACK_SECRET_NAMES": "HF_TOKEN"}),  # (its driver reads them)
        ("j1-a", SPMD, {"entrypoint_num_cpus": 1}, {}),  # (its driver may run on another node)
        ("j1-a", SPMD, {"entrypoint_resources": {"x": 1}}, {}),
        ("j1-a", SPMD, {}, {"RAYSTACK_SPMD_AHEAD": "0"}),
        ("j1-a", SPMD, {}, {"RAYSTACK_SPMD_POOL": "0"}),  # (no launch hosts for it)
        ("../x", SPMD, {}, {}),
        (".hidden", SPMD, {}, {}),
    ],
)
def test_what_is_not_asked_for(
    host: tuple[Path, threading.Event], sid: str, entrypoint: str, options: dict, env: dict
) -> None:
    folder, heard = host
    options = {"runtime_env": {"env_vars": env}, **options}
    assert not ahead.ask(sid, entrypoint, options, str(folder))
    assert not heard.wait(0.2)
    assert not (folder / pool.REQUESTS).exists() or not os.listdir(folder / pool.REQUESTS)


def test_where_no_host_listens_nothing_is_left_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert not ask(tmp_path)  # (no pipe: the cluster's hosts are off, or from before this)
    assert os.listdir(tmp_path / pool.REQUESTS) == []
    os.mkfifo(tmp_path / pool.WAKE)  # (a pipe nobody reads: its host is gone)
    assert not ask(tmp_path)
    assert os.listdir(tmp_path / pool.REQUESTS) == []


def test_a_runner_without_a_node_temp_folder_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYSTACK_NODE_TMP", raising=False)
    assert not ahead.ask("j2", SPMD, {"runtime_env": {}})


def test_the_driver_reads_its_submission_id_from_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"runtime_env": {}, "metadata": {"job_submission_id": "j7-retry1", "job_name": "x"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(config))
    assert ahead.submission_id() == "j7-retry1"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{not json")
    assert ahead.submission_id() is None
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    assert ahead.submission_id() is None  # (`python -m raystack.launch.spmd` by hand)
