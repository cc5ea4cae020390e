"""The head's warm-up job (allocation/warmup.py) never fails or holds up a start: without a Jobs
API that answers it gives up with the reason, and RAYSTACK_WARMUP=0 leaves it out. That it runs
and leaves no job behind on a real cluster: tests/testbed/test_cluster.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from raystack.allocation.warmup import START, Warmup
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
    clock = FakeClock()
    warm = Warmup("c", f"http://127.0.0.1:{closed_port()}", "7", clock=clock).start()
    warm.finish(timeout=60)
    assert warm.done.is_set()
    assert warm.took is None and warm.why and "the Jobs API" in warm.why, warm.why
    assert clock.now() >= START  # (it waited its time on its own clock, then gave up)


def test_raystack_warmup_0_leaves_it_out(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSTACK_WARMUP", "0")
    warm = Warmup("c", "http://127.0.0.1:1", "7").start()
    warm.finish(timeout=10)
    assert warm.took is None and warm.why == "RAYSTACK_WARMUP=0"


def test_a_warm_up_with_nothing_to_overlap_is_left_out_unless_asked(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One node without GPUs: READY would only come later (the Jobs API answers last there)."""
    warm = Warmup("c", "http://127.0.0.1:1", "7", overlaps=False).start()
    warm.finish(timeout=10)
    assert warm.took is None and warm.why and "nothing to overlap" in warm.why
    monkeypatch.setenv("RAYSTACK_WARMUP", "1")
    clock = FakeClock()
    warm = Warmup("c", f"http://127.0.0.1:{closed_port()}", "7", overlaps=False, clock=clock).start()
    warm.finish(timeout=60)
    assert warm.why and "the Jobs API" in warm.why  # (asked for: it tried)
