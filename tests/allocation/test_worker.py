"""A worker's join: back-off between tries of `ray start`, and joining in waves (join_window)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from raystack.allocation.node import worker
from raystack.allocation.node.context import NodeContext
from raystack.store import cluster as clusters
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.waiting import FakeClock


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    monkeypatch.setattr(worker, "TURN_POLL", 0.02)
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.STARTING, allocation_id="7", nodes_joined=1))
    return tmp_path


def ctx(tmp_path: Path, node_id: int, window: int) -> NodeContext:
    return NodeContext(
        cluster="c",
        alloc_id="7",
        node_id=node_id,
        num_nodes=16,
        host=f"node{node_id + 1}",
        ip="10.0.0.5",
        gpus=0,
        cpus=4,
        temp_dir=tmp_path / "t",
        object_store_bytes=2**28,
        join_timeout=120,
        join_window=window,
    )


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    for attempt, top in [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (12, 16.0)]:
        delays = [worker.backoff(attempt) for _ in range(200)]
        assert all(top / 2 <= d <= top for d in delays)
        assert max(delays) - min(delays) > top / 10  # jittered: workers that failed together spread


def test_the_first_window_starts_at_once_the_rest_wait_for_their_turn(home: Path) -> None:
    t0 = time.monotonic()
    worker.wait_turn(ctx(home, node_id=4, window=4))  # workers 1-4: no wait
    worker.wait_turn(ctx(home, node_id=9, window=0))  # no window: all at once
    assert time.monotonic() - t0 < 0.5

    # Worker 6 of window 4 needs 6 - 4 + 1 = 3 nodes (the head and two workers). On a fake clock
    # each poll is one sleep: it waits through every read that counts 2, and goes at the first 3.
    clock, seen = FakeClock(), []

    def sleep(seconds: float) -> None:
        seen.append(clusters.read("c").nodes_joined)
        clock.advance(seconds)
        if len(seen) == 3:
            clusters.update("c", nodes_joined=3)

    clock.sleep = sleep
    clusters.update("c", nodes_joined=2)
    worker.wait_turn(ctx(home, node_id=6, window=4), clock=clock)
    assert seen == [2, 2, 2]


def test_a_stalled_wave_or_an_ended_cluster_lets_the_waiter_go(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "STALL", 0.3)
    t0 = time.monotonic()
    worker.wait_turn(ctx(home, node_id=10, window=2))  # nobody joins: goes after STALL
    assert 0.3 <= time.monotonic() - t0 < 3
    monkeypatch.setattr(worker, "STALL", 60)
    clusters.update("c", state=ClusterState.FAILED)
    t0 = time.monotonic()
    worker.wait_turn(ctx(home, node_id=10, window=2))
    assert time.monotonic() - t0 < 1
    assert not worker.joining(ctx(home, node_id=10, window=2))
