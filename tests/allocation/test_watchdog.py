"""Stuck jobs end, with the reason, and the queue goes on: the runner's watchdog against a fake
Jobs API and State API (the same on the testbed: tests/testbed/test_soak.py)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from raystack.allocation.runner.loop import Runner
from raystack.allocation.watchdog.verdict import sample_active
from raystack.store import node_entries, paths, progress, queue, stacks
from raystack.store.ledger import JobRequest, JobState, read_job, update_job
from tests.allocation.test_runner import FakeApi, Free, home  # noqa: F401 (the fixture)
from tests.conftest import wait_until

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
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
    assert record.state is JobState.FAILED and record.message.startswith("hung: no progress for 1m")
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


@pytest.mark.parametrize("group_pending", [True, False])
def test_an_spmd_job_whose_group_the_launch_host_made_waits_it_is_not_hung(
    home: Path,  # noqa: F811
    group_pending: bool,
) -> None:
    """GPU suite, 1 x H100: a torchrun job started ahead (its placement group made by the launch
    host at the submit, so not its own Ray job's) waited 80 s for the GPU other jobs held, its
    driver in ray.get, and was stopped as hung. Its group pending: waiting, never hung; without
    it the same silence is a hang."""
    api, clock = FakeApi(), Clock()
    r = runner(api, clock)
    job = submit("spmd", hang_timeout=30)
    r.tick()
    api.set(job, "RUNNING")
    if group_pending:  # (by the group's name: its creator is the warm-up job that made the host)
        whole_node = {"CPU": 16.0, "GPU": 4.0}
        api.demands[f"raystack-spmd-{job}"] = [
            {"kind": "placement group", "name": f"raystack-spmd-{job}", "bundles": [whole_node]}
        ]
    r.tick()
    wait_until(lambda: paths.cluster("c").job_log(job).exists(), 30, "the log tail's first write")
    t = time.time()
    for i in range(10):  # 100 s: quiet samples every 10 s
        write_samples(job, 0.0, t + 10 * i, 1)
        clock.t += 10
        r.tick()
    assert (api.stopped == []) is group_pending
    assert (job in stacks.requests("c")) is not group_pending


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


def write_progress(job: str, t: float, n: int, moved: float, busy: float = 1.0, host: str = "node1") -> None:
    """One usage sample of `host` with its progress row (allocation/watchdog/progress.py) for `job`:
    `busy` cores and a GPU at 100 % whatever the stacks say."""
    path = paths.cluster("c").usage_file("100", host)
    row = {"host": host, "n": n, "moved": moved, "procs": 2}
    sample = {"t": t, "cpu": 50, "ours": busy, "gpus": [[100.0, 1485, 81559]], "jobs": {job: [busy, busy, 2]}}
    with open(path, "a") as fh:
        fh.write(json.dumps({**sample, "progress": {job: row}}) + "\n")


def running_job(api: FakeApi, clock: Clock, **fields: object) -> tuple[Runner, str]:
    r = runner(api, clock)
    job = submit("spins", **fields)
    r.tick()
    api.set(job, "RUNNING")
    r.tick()
    log = paths.cluster("c").job_log(job)
    wait_until(lambda: log.exists() and log.stat().st_size > 0, 30, "the log tail's first write")
    return r, job


def test_a_job_busy_on_every_meter_whose_stacks_never_move_is_hung(home: Path) -> None:  # noqa: F811
    """2 x H100: rank 0 spun in all_reduce + synchronize at 100 % GPU and a full core, its peer never
    came; the old rule (no CPU, no GPU use) saw activity and let it run 9 minutes past the timeout."""
    api, clock = FakeApi(), Clock()
    r, job = running_job(api, clock, hang_timeout=60)
    assert progress.watched("c") == {job: 10.0}  # the nodes were asked to sample its stacks
    t = time.time()
    for i in range(8):  # 80 s: busy, never moving
        write_progress(job, t + 10 * i, n=i + 1, moved=0.0)
        clock.t += 10
        r.tick()
    assert api.stopped == [job], read_job("c", job).message
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.FAILED
    assert record.message.startswith("hung: no progress for 1m (no output, no stack moved)"), record.message
    assert progress.watched("c") == {}  # nothing more to sample


def test_a_job_whose_stacks_move_is_not_hung_however_quiet(home: Path) -> None:  # noqa: F811
    """A learner waiting on a slow generator: nothing printed, the learner asleep, but the
    generator's stack moves on another node."""
    api, clock = FakeApi(), Clock()
    r, job = running_job(api, clock, hang_timeout=30)
    t = time.time()
    for i in range(20):  # 200 s without output
        write_progress(job, t + 10 * i, n=i + 1, moved=0.0, busy=0.0, host="node1")  # the learner
        write_progress(job, t + 10 * i, n=i + 1, moved=t + 10 * i if i % 2 else 0.0, host="node2")
        clock.t += 10
        r.tick()
    assert api.stopped == [] and read_job("c", job).state is JobState.RUNNING


def test_a_node_without_py_spy_falls_back_to_cpu_use(home: Path) -> None:  # noqa: F811
    api, clock = FakeApi(), Clock()
    r, job = running_job(api, clock, hang_timeout=30)
    path = paths.cluster("c").usage_file("100", "node1")
    t = time.time()
    for i in range(10):
        row = {"host": "node1", "n": i + 1, "moved": 0.0, "procs": 1, "error": "py-spy not found"}
        sample = {"t": t + 10 * i, "gpus": [], "jobs": {job: [0.9, 0.9, 1]}, "progress": {job: row}}
        with open(path, "a") as fh:
            fh.write(json.dumps(sample) + "\n")
        clock.t += 10
        r.tick()
    assert api.stopped == []  # (busy, and nothing better is known)


def test_a_hung_jobs_message_names_the_rank_that_never_arrived(home: Path) -> None:  # noqa: F811
    """The stacks and flight recorders dumped on 2 x H100 (tests/fixtures/gpu) put in the job's
    folder as the nodes would: the message says what they show."""
    api, clock = FakeApi(), Clock()
    r, job = running_job(api, clock, hang_timeout=60)
    node_entries.write_node_entry("c", "vm", {"alloc_id": "100", "ip": "10.0.0.1"})
    t = time.time()
    for i in range(8):
        write_progress(job, t + 10 * i, n=i + 1, moved=0.0)
        clock.t += 10
        r.tick()
    asked = stacks.requests("c")[job]
    assert "dumping stacks" in read_job("c", job).message and api.stopped == []  # waits for the node
    job_dir = paths.cluster("c").job_files(job)
    shutil.copytree(GPU / "stacks", job_dir / "stacks", dirs_exist_ok=True, copy_function=shutil.copy)
    shutil.copytree(GPU / "flight", job_dir / "flight", dirs_exist_ok=True, copy_function=shutil.copy)
    stacks.answer("c", job, "vm", asked, 2)
    r.tick()
    assert api.stopped == [job]
    r.tick()
    message = read_job("c", job).message
    assert message.startswith("hung: no progress for 1m (no output, no stack moved): flight recorder: "), (
        message
    )
    assert "rank 1 never reached it (last collective #1)" in message
    assert "rank 1 never arrived (asleep in <module> (hang.py:17))" in message
    assert "rank 0 waits for the GPU (torch.cuda.synchronize) at hang.py:20" in message
    assert message.endswith(f"stacks in {job_dir / 'stacks'}")


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


def quiet_then(
    r: Runner, clock: Clock, job: str, t: float, first: int, last: int, moved: float = 0.0
) -> None:
    for i in range(first, last):  # samples every 10 s
        write_progress(job, t + 10 * i, n=i + 1, moved=moved)
        clock.t += 10
        r.tick()


def test_warn_flags_a_suspected_hang_lets_it_run_and_clears_it_when_it_moves(home: Path) -> None:  # noqa: F811
    """hang_action: warn: at the verdict the stacks are asked for and the message says since when;
    the job is not stopped; once it moves again the suspicion is lifted."""
    api, clock = FakeApi(), Clock()
    r, job = running_job(api, clock, hang_timeout=60, hang_action="warn")
    t = time.time()
    quiet_then(r, clock, job, t, 0, 10)
    record = read_job("c", job)
    assert job in stacks.requests("c") and api.stopped == [] and record.state is JobState.RUNNING
    assert record.message.startswith("suspected hang since ") and "(hang_action: warn)" in record.message
    assert record.suspected is not None and record.fault is None
    quiet_then(r, clock, job, t, 10, 16)
    assert api.stopped == [] and read_job("c", job).suspected is not None  # (still quiet: still suspected)
    write_progress(job, t + 200, n=20, moved=t + 200, host="node2")  # a move on another node
    clock.t += 10
    r.tick()
    record = read_job("c", job)
    assert record.suspected is None and "moved again at" in record.message, record.message
    assert "on node2, after a suspected hang since" in record.message
    assert api.stopped == []


def test_a_job_that_moves_while_its_stacks_are_dumped_is_not_stopped(home: Path) -> None:  # noqa: F811
    """stop: the verdict waits for the nodes' dumps; a move reported meanwhile lifts it (a long line
    that ended just then), while the lines a flight-recorder dump prints do not."""
    api, clock = FakeApi(), Clock()
    r, job = running_job(api, clock, hang_timeout=60)
    node_entries.write_node_entry("c", "vm", {"alloc_id": "100", "ip": "10.0.0.1"})
    t = time.time()
    quiet_then(r, clock, job, t, 0, 8)
    assert "dumping stacks" in read_job("c", job).message and api.stopped == []
    with open(paths.cluster("c").job_log(job), "a") as fh:
        fh.write("[rank0]: dumping the flight recorder\n")  # (output during the dumps: not progress)
    clock.t += 5
    r.tick()
    assert read_job("c", job).fault is not None and api.stopped == []
    write_progress(job, t + 90, n=10, moved=t + 90)
    clock.t += 5
    r.tick()
    r.tick()
    record = read_job("c", job)
    assert api.stopped == [] and record.fault is None and record.suspected is None, record.message
    assert record.state is JobState.RUNNING and "moved again" in record.message


def test_a_full_filesystem_is_said_once_a_minute_not_on_every_pass(
    home: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 65: with RAYSTACK_HOME full the runner logged 'cannot ask the nodes to sample stacks'
    and 'worker logs not gathered' on every pass (two lines every ~1 s, into a log on that same
    filesystem). Each is said at once, then once a minute with a count, and when it works again."""
    import errno
    import logging

    from raystack.allocation.runner import logtail
    from raystack.allocation.watchdog.verdict import Watch, Watchdog
    from raystack.store import raylogs
    from raystack.store.ledger import read_job
    from raystack.waiting import FakeClock

    clock = FakeClock()
    dog = Watchdog("c", FakeApi(), "100", None, clock=clock)
    dog.watches["s"] = Watch("s", "j", 30.0, 60.0, 0.0, hang_checked=0.0)
    full = OSError(errno.ENOSPC, "No space left on device", "/rs/clusters/c/logs/progress.request")

    def refuse(*_: object) -> None:
        raise full

    monkeypatch.setattr(logtail.GATHERING, "clock", clock.now)
    record = read_job("c", submit())
    with caplog.at_level(logging.INFO, logger="raystack.runner"):
        with pytest.MonkeyPatch.context() as full_disk:  # (undone alone: not the fixture's home)
            full_disk.setattr(progress, "watch", refuse)
            full_disk.setattr(raylogs, "request_sync", refuse)
            for _ in range(130):  # 130 passes, a second apart
                dog.ask_nodes()
                assert logtail.gather("c", "100", FakeApi(), record) is None
                clock.t += 1.0
        dog.ask_nodes()
    lines = [r.getMessage() for r in caplog.records]
    asked = [line for line in lines if line.startswith("asking the nodes to sample stacks")]
    gathered = [line for line in lines if line.startswith("gathering worker logs")]
    assert len(asked) == 4 and len(gathered) == 3, lines
    assert asked[0].startswith("asking the nodes to sample stacks failed, retrying: [Errno 28]")
    assert asked[1].startswith("asking the nodes to sample stacks failed 60 more time(s) in 60s")
    assert asked[3].startswith("asking the nodes to sample stacks succeeds again")
    assert gathered[0].startswith(f"gathering worker logs failed, retrying: {record.id}: [Errno 28]")
