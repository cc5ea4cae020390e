"""The head's warm-up job (allocation/head/warmup.py) never fails or holds up a start: without a Jobs
API that answers it gives up with the reason, READY waits for it at most its time, and
RAYSTACK_WARMUP=0 (or one node without GPUs) leaves it out. That it runs and leaves no job behind
on a real cluster: tests/testbed/test_cluster.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from raystack.allocation.head.warmup import START, Warmup, launch
from raystack.store import cluster as clusters
from raystack.waiting import FakeClock


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    return tmp_path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_jobs_api_that_never_answers_gives_the_warm_up_up_with_the_reason(home: Path) -> None:
    clock, said = FakeClock(), []
    Warmup("c", f"http://127.0.0.1:{closed_port()}", "7", clock=clock, say=said.append).run()
    assert len(said) == 1 and said[0].startswith("skipped: ") and "the Jobs API" in said[0], said
    assert clock.now() >= START  # (it waited its time on its own clock, then gave up)


def test_it_is_left_out_when_asked_or_with_nothing_to_overlap(home: Path) -> None:
    url = "http://127.0.0.1:1"
    assert launch("c", url, "7", True, {"RAYSTACK_WARMUP": "0"}).finish(1) == "left out: RAYSTACK_WARMUP=0"
    one = launch("c", url, "7", False, {})  # one node without GPUs: the Jobs API answers last there
    assert one.proc is None and "nothing to overlap" in one.finish(1)


def test_ready_waits_for_its_process_at_most_its_time(home: Path) -> None:
    """Asked for on one node (RAYSTACK_WARMUP=1): a process of its own starts; with no Jobs API
    answering, READY goes on after the time given."""
    env = {**os.environ, "RAYSTACK_WARMUP": "1"}
    started = launch("c", f"http://127.0.0.1:{closed_port()}", "7", False, env)
    try:
        assert started.proc is not None and started.finish(1) == "still running after 1s: READY without it"
        assert started.proc.poll() is None
    finally:
        if started.proc is not None:
            started.proc.kill()
            started.proc.wait()
