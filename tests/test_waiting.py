"""raystack.waiting, the one way to wait, and the waits built on it, on a FakeClock: time moves
only when the code sleeps, so each timeout below is reached without waiting for it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from raystack import waiting
from raystack.adapters import local
from raystack.client import Job
from raystack.client.top import watch
from raystack.errors import ClusterError, RaystackError
from raystack.store import cluster as clusters
from raystack.store import files, queue, stacks
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRequest
from raystack.waiting import Clock, FakeClock, at_most, poll_until, retry, until


class Recorded(FakeClock):
    """A FakeClock that keeps every sleep."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.slept: list[float] = []
        self.sleep = self.record

    def record(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    return tmp_path


def test_until_returns_the_first_value_and_sleeps_between_steps() -> None:
    clock, values = Recorded(), iter([None, None, 0, "x"])
    assert until(lambda: next(values), 2.0, clock) == 0  # (0 is a value; only None means "again")
    assert clock.slept == [2.0, 2.0]


def test_until_gives_up_after_its_timeout_with_the_callers_error() -> None:
    clock = Recorded()
    with pytest.raises(KeyError):
        until(lambda: None, 1.0, clock, timeout=10, expired=lambda: KeyError("late"))
    assert 10 <= clock.t <= 11
    with pytest.raises(RaystackError, match="timed out after 5s"):
        until(lambda: None, 1.0, Recorded(), timeout=5)


def test_until_takes_each_delay_from_a_function() -> None:
    clock, steps = Recorded(), iter(range(5))
    backoff = waiting.Backoff(first=0.5, cap=2.0, jitter=0.0)
    until(lambda: True if next(steps) == 4 else None, backoff.next, clock)
    assert clock.slept == [0.5, 1.0, 2.0, 2.0]


def test_at_most_returns_none_at_its_timeout_without_raising() -> None:
    clock = Recorded()
    assert at_most(lambda: None, 0.5, clock, timeout=3) is None
    assert 3 <= clock.t <= 3.5
    assert at_most(lambda: "done", 0.5, clock, timeout=3) == "done"


def test_retry_stops_at_the_first_success_and_never_sleeps_after_the_last_try() -> None:
    clock, tried = Recorded(), []
    assert retry(lambda n: tried.append(n) or (n if n == 1 else None), 5, 0.2, clock) == 1
    assert tried == [0, 1] and clock.slept == [0.2]
    clock, tried = Recorded(), []
    assert retry(lambda n: tried.append(n), 3, 0.2, clock) is None
    assert tried == [0, 1, 2] and clock.slept == [0.2, 0.2]


def test_poll_until_backs_off_and_aborts_with_the_reason() -> None:
    clock = Recorded()
    with pytest.raises(RaystackError, match="timed out after 2s waiting for the thing"):
        poll_until(lambda: False, 2, "the thing", clock)
    assert clock.slept[:3] == pytest.approx([0.05, 0.075, 0.1125]) and max(clock.slept) == 0.25
    with pytest.raises(RaystackError, match="head gone while waiting for the thing"):
        poll_until(lambda: None, 2, "the thing", Recorded(), abort=lambda: "head gone")


def test_a_jobs_wait_times_out_on_the_clock_and_says_its_state(home: Path) -> None:
    clusters.create("c")
    clusters.write(
        ClusterRecord(name="c", state=ClusterState.READY, allocation_id="local-1", backend="local")
    )
    queue.enqueue(JobRequest(id="j-1", name="j", cluster="c", entrypoint="true"))
    clock, began = Recorded(), time.monotonic()
    with pytest.raises(ClusterError, match="job j-1 still QUEUED after 30s"):
        Job("c", "j-1").wait(timeout=30, poll=0.2, clock=clock)
    assert 30 <= clock.t <= 30.5 and time.monotonic() - began < 10


def test_stack_dumps_wait_for_every_host_then_name_the_late_ones(home: Path) -> None:
    clusters.create("c")
    clock = Recorded()
    dumps = stacks.wait("c", "j-1", time.time(), ["node1", "node2"], timeout=20, clock=clock)
    assert dumps.late == ["node1", "node2"] and 20 <= clock.t <= 20.5
    assert set(clock.slept) == {0.2}


def test_a_local_allocation_is_said_gone_only_after_three_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    looks: list[list[int] | None] = [[], [], []]
    monkeypatch.setattr(local, "pids", lambda alloc_id: looks.pop(0))
    clock = Recorded()
    assert local.alive("local-1", clock=clock) is False
    assert clock.slept == [0.2, 0.2]
    looks[:] = [[], [4242]]
    assert local.alive("local-1", clock=Recorded()) is True
    looks[:] = [None]
    assert local.alive("local-1", clock=Recorded()) is None  # (cannot tell: never "gone")


def test_a_held_link_lock_gives_up_naming_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "t": time.time()}))
    clock = Recorded()
    held = r"could not take the lock .* within 60s \(held by"
    with pytest.raises(ClusterError, match=held), files.link_lock(path, lease=3600, timeout=60, clock=clock):
        pass
    assert 60 <= clock.t <= 60.5 and clock.slept[:3] == [0.005, 0.01, 0.02] and max(clock.slept) == 0.2


def test_top_watches_until_the_cluster_has_ended(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raystack.client import top

    views = iter([{"ended": False}, {"ended": False}, {"ended": True}])
    monkeypatch.setattr(top, "snapshot", lambda name: next(views))
    shown: list[dict] = []
    clock = Recorded()
    assert watch("c", 2.0, shown.append, clock) == {"ended": True}
    assert len(shown) == 3 and clock.slept == [2.0, 2.0, 2.0]


def test_the_real_clock_sleeps() -> None:
    began = time.monotonic()
    until(lambda: None if time.monotonic() - began < 0.05 else True, 0.01, Clock())
    assert time.monotonic() - began >= 0.05
