"""Stuck jobs end, with the reason, and the queue goes on: the runner's watchdog against a fake
Jobs API and State API (the same on the testbed: tests/testbed/test_soak.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from raystack.allocation.runner import Runner
from raystack.allocation.watchdog import sample_active
from raystack.store import paths, queue, stacks
from raystack.store.ledger import JobRequest, JobState, read_job, update_job
from tests.allocation.test_runner import FakeApi, Free, home  # noqa: F401 (the fixture)
from tests.conftest import wait_until

BIG = {"kind": "actor", "name": "Big", "bundles": [{"CPU": 1.0, "GPU": 5.0}], "ray_infeasible": False}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def submit(name: str = "j", **fields: object) -> str:
    request = JobRequest(
        id=f"{name}-{time.time_ns() % 10**8:08d}", name=name, cluster="c", entrypoint="x", **fields
    )
    return queue.enqueue(request).id


def runner(api: FakeApi, clock: Clock) -> Runner:
    r = Runner("c", api=api, allocation="100", resources_free=Free(), clock=clock)
    r.drain = None
    return r


def test_an_infeasible_actor_fails_its_job_after_the_grace_and_the_queue_goes_on(home: Path) -> None:  # noqa: F811
    """cde9410: an actor asking 5 GPUs of 4-GPU nodes sat RUNNING forever, and every job behind it."""
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    big, after = submit("big", retries=3, infeasible_grace=30), submit("after")
    r.tick()
    api.set(big, "RUNNING")
    api.demands[f"ray-{big}"] = [BIG]
    for _ in range(6):  # 25 s: within the grace
        r.tick()
        clock.t += 5
    assert read_job("c", big).state is JobState.RUNNING and api.stopped == []
    clock.t += 10
    r.tick()
    assert api.stopped == [big]
    r.tick()
    record = read_job("c", big)
    want = "infeasible: actor Big wants {GPU: 5, CPU: 1}; the largest node has {GPU: 4, CPU: 16}"
    assert record.state is JobState.FAILED and record.message == want
    assert record.attempt_ids == [big]  # never retried after an infeasible end
    r.tick()
    assert api.submitted == [big, after]


def test_a_demand_that_becomes_feasible_resets_the_grace(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit(infeasible_grace=30)
    r.tick()
    api.set(job, "RUNNING")
    api.demands[f"ray-{job}"] = [BIG]
    for _ in range(4):
        r.tick()
        clock.t += 5
    api.demands[f"ray-{job}"] = []  # (a node with 8 GPUs joined)
    for _ in range(20):
        r.tick()
        clock.t += 5
    assert read_job("c", job).state is JobState.RUNNING and api.stopped == []


def test_a_driver_asking_resources_no_node_has_never_waits_forever(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit(entrypoint_resources={"TPU": 4.0}, infeasible_grace=10)
    r.tick()  # submitted; Ray keeps it PENDING
    for _ in range(4):
        r.tick()
        clock.t += 5
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.FAILED and record.message.startswith("infeasible: the driver wants {")
    assert "TPU: 4" in record.message


def test_a_driver_asking_more_memory_than_any_node_has_never_waits_forever(home: Path) -> None:  # noqa: F811
    """Before: `--entrypoint-memory 100G` on 20 GiB nodes stayed SUBMITTED for ever (the driver's
    memory was not part of its demand) and held the queue."""
    api, clock = FakeApi(), Clock()
    for node in api.nodes:
        node.resources["memory"] = 20.0 * 2**30
    r = runner(api, clock)
    job = submit(entrypoint_memory=100 * 2**30, infeasible_grace=10)
    small = submit(entrypoint_memory=2**30)
    api.stop = lambda sid: api.stopped.append(sid) or True  # type: ignore[method-assign]
    # (Ray's stop of a job it keeps PENDING waits for a driver that never starts: nothing changes)
    for _ in range(10):
        r.tick()
        clock.t += 5
    assert api.stopped == [job] and api.ray[job].status == "PENDING"
    record = read_job("c", job)
    assert record.state is JobState.FAILED, record.message
    wants = "the driver wants {memory: 100GiB}; the largest node has {GPU: 4, CPU: 16, memory: 20GiB}"
    assert record.message == f"infeasible: {wants}", record.message
    assert read_job("c", small).state is not JobState.QUEUED  # the queue went on


def write_samples(job: str, busy: float, t0: float, n: int) -> None:
    path = paths.cluster("c").usage_file("100", "node1")
    with open(path, "a") as fh:
        for i in range(n):
            sample = {"t": t0 + i, "cpu": 5, "ours": 0.1, "gpus": [], "jobs": {job: [busy, busy, 3]}}
            fh.write(json.dumps(sample) + "\n")


def test_a_silent_idle_job_is_hung_its_stacks_asked_for_then_stopped(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job, after = submit("hangs", hang_timeout=60, retries=2), submit("after")
    r.tick()
    api.set(job, "RUNNING")
    r.tick()
    # The runner's log tail writes the job's first line from its own thread: new output is a sign of
    # life, so wait for it before the (fake) clock moves (a late write reset the silence: seen in CI).
    log = paths.cluster("c").job_log(job)
    wait_until(lambda: log.exists() and log.stat().st_size > 0, 30, "the log tail's first write")
    t = time.time()
    for i in range(8):  # 80 s with quiet samples every 10 s (and one busy one at 20 s)
        write_samples(job, 0.5 if i == 2 else 0.0, t + 10 * i, 1)
        clock.t += 10
        r.tick()
    assert api.stopped == []  # busy at 20 s: not yet 60 s of silence
    for i in range(8, 12):
        write_samples(job, 0.0, t + 10 * i, 1)
        clock.t += 10
        r.tick()
    asked = stacks.requests("c")
    assert job in asked  # every node was asked for the job's stacks before the stop
    assert api.stopped == [job]  # (no node entries here: nobody to wait for)
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.FAILED and record.message.startswith("hung: no output or activity for 1m")
    assert "stacks in" in record.message and record.attempt_ids == [job]
    r.tick()
    assert api.submitted == [job, after]


def test_output_or_a_busy_process_keeps_a_job_alive(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit(hang_timeout=30)
    r.tick()
    api.set(job, "RUNNING")
    r.tick()
    log = paths.cluster("c").job_log(job)
    t = time.time()
    for i in range(20):
        write_samples(job, 0.0, t + 10 * i, 1)
        with open(log, "a") as fh:
            fh.write(f"step {i}\n")  # prints, uses nothing: alive
        clock.t += 10
        r.tick()
    assert api.stopped == []
    assert not sample_active({"jobs": {job: [0.01, 0.01, 2]}, "gpus": [[0.0, 10, 80]]}, job)
    assert sample_active({"jobs": {}, "gpus": [[93.0, 10, 80]]}, job)


def test_without_usage_samples_nothing_is_judged_hung(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit(hang_timeout=30)
    r.tick()
    api.set(job, "RUNNING")
    for _ in range(30):  # (the nodes cannot write their samples: a full quota)
        clock.t += 10
        r.tick()
    assert api.stopped == [] and read_job("c", job).state is JobState.RUNNING


@pytest.mark.parametrize(("ran", "retried"), [(20.0, True), (900.0, False)])
def test_retries_only_within_the_window_of_a_start(home: Path, ran: float, retried: bool) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit(retries=2, retry_window=300)
    r.tick()
    api.set(job, "RUNNING")
    r.tick()
    info = api.ray[job]
    info.start_time = int((time.time() - ran) * 1000)
    api.set(job, "FAILED", 1)
    r.tick()
    record = read_job("c", job)
    if retried:
        assert record.attempt_ids == [job, f"{job}-retry1"] and record.state is not JobState.FAILED
        assert str(record.attempts[0].outcome).startswith("FAILED: exit code 1")
        assert "retry 1 of 2" in record.message
    else:
        assert record.state is JobState.FAILED and record.attempt_ids == [job]


def test_a_stopped_job_is_never_retried(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit(retries=2)
    r.tick()
    api.set(job, "RUNNING")
    r.tick()
    update_job("c", job, stop_requested=time.time())
    r.tick()
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.STOPPED and record.attempt_ids == [job]


def test_a_stuck_jobs_message_is_its_fault_not_its_stopped_actors(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit(infeasible_grace=5)
    r.tick()
    api.set(job, "RUNNING")
    api.demands[f"ray-{job}"] = [BIG]
    api.errors[f"ray-{job}"] = [
        {"ip": "10.0.0.1", "pid": 9, "actor": "Worker", "error": "Worker exit: killed by ray.kill", "at": 1.0}
    ]
    for _ in range(4):
        r.tick()
        clock.t += 5
    api.set(job, "STOPPED")
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.FAILED and record.message.startswith("infeasible: actor Big")
    assert record.actor_error  # (what the actors said is kept beside it)
