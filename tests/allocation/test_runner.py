"""The queue runner's state machine against a fake Jobs API (no Ray): order, drain, retries,
stop, timeout, restarts, foreign submission ids, orphans of ended allocations, bad files.

The same behaviour against the real Jobs API on the testbed: tests/testbed/test_queue.py.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from raystack.adapters.ray import NodeSummary
from raystack.allocation.runner.drain import Drain
from raystack.allocation.runner.loop import TICK, Runner
from raystack.errors import AlreadyExists, RayApiError
from raystack.spec.planning import PlanSpec, substitute
from raystack.store import cluster as clusters
from raystack.store import node_entries, paths, queue, workerlogs
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRequest, JobState, read_job
from raystack.store.raylogs import last_line
from raystack.waiting import Repeats


@dataclass
class Info:
    job_id: str
    status: str = "PENDING"
    metadata: dict = field(default_factory=dict)
    message: str = ""
    driver_exit_code: int | None = None
    start_time: int | None = None
    end_time: int | None = None


class FakeJobs:
    """What LogTail needs from JobSubmissionClient: a log stream."""

    def __init__(self, api: FakeApi):
        self.api = api

    async def tail_job_logs(self, sid: str):  # type: ignore[no-untyped-def]
        yield self.api.log_text.get(sid, "")


class FakeApi:
    def __init__(self) -> None:
        self.ray: dict[str, Info] = {}
        self.submitted: list[str] = []
        self.stopped: list[str] = []
        self.log_text: dict[str, str] = {}
        self.env: dict[str, dict] = {}
        self.entrypoints: dict[str, str] = {}
        self.jobs = FakeJobs(self)
        self.errors: dict[str, list[dict]] = {}  # by Ray job id: what job_errors reports
        self.demands: dict[str, list[dict]] = {}  # by Ray job id or group name: what pending_demands reports
        self.nodes = [NodeSummary(f"n{i}", f"10.0.0.{i}", i == 1, {"CPU": 16.0, "GPU": 4.0}) for i in (1, 2)]

    def alive_nodes(self) -> list[NodeSummary]:
        return self.nodes

    def warm(self) -> bool:
        self.warmed = getattr(self, "warmed", 0) + 1
        return True

    def dead_nodes(self) -> list[NodeSummary]:
        return []

    def job_nodes(self, ray_job_id: str, groups: tuple[str, ...] = ()) -> set[str]:
        return set()

    def pending_demands(self, ray_job_id: str, groups: tuple[str, ...] = ()) -> list[dict]:
        return [d for key in (ray_job_id, *groups) for d in self.demands.get(key, [])]

    def submit(self, sid: str, entrypoint: str, runtime_env: dict, **options: Any) -> None:
        if sid in self.ray:
            raise AlreadyExists(
                f"Job with submission_id {sid} already exists. Please use a different submission_id."
            )
        self.submitted.append(sid)
        self.env[sid] = runtime_env["env_vars"]
        self.entrypoints[sid] = entrypoint
        self.ray[sid] = Info(job_id=f"ray-{sid}", metadata=options["metadata"])
        self.log_text[sid] = f"log of {sid}\n"

    def info(self, sid: str) -> Info | None:
        return self.ray.get(sid)

    def stop(self, sid: str) -> bool:
        self.stopped.append(sid)
        self.set(sid, "STOPPED")
        return True

    def logs(self, sid: str) -> str:
        return self.log_text.get(sid, "")

    def log_bounded(self, sid: str, limit: int) -> str | None:
        return self.log_text.get(sid, "")

    def job_leftovers(self, ray_job_id: str) -> list[str]:
        return []

    def job_errors(self, ray_job_id: str) -> list[dict]:
        return self.errors.get(ray_job_id, [])

    def set(self, sid: str, status: str, code: int | None = None) -> None:
        info = self.ray[sid]
        info.status = status
        if status == "RUNNING":
            info.start_time = int(time.time() * 1000)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            info.end_time = int(time.time() * 1000)
            info.driver_exit_code = code


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    clusters.write(
        ClusterRecord(name="c", state=ClusterState.READY, allocation_id="100", dashboard_url="http://x")
    )
    return tmp_path


class Free:
    """resources_free for tests: free unless told otherwise; counts the drains it saw."""

    def __init__(self) -> None:
        self.free = True
        self.seen: list[str] = []

    def __call__(self, drain: Drain) -> bool:
        self.seen.append(drain.job_id)
        return self.free


def runner(api: FakeApi, free: Free | None = None, allocation: str = "100") -> Runner:
    """A runner past its start-up drain (see test_a_new_runner_first_checks_the_resources)."""
    r = Runner("c", api=api, allocation=allocation, resources_free=free or Free())
    r.drain = None
    return r


def running(api: FakeApi, **spec: Any) -> tuple[Runner, str]:
    """A runner and a job of it that Ray reports RUNNING."""
    r = runner(api)
    job = submit(**spec)
    r.tick()
    api.set(job, "RUNNING")
    r.tick()
    return r, job


def test_a_new_runner_first_checks_the_resources(home: Path) -> None:
    """After a restart the last job's resources may still be held: check before starting."""
    api, free = FakeApi(), Free()
    free.free = False
    job = submit()
    r = Runner("c", api=api, allocation="100", resources_free=free)
    r.tick()
    r.tick()
    assert api.submitted == [] and free.seen == ["(restart)", "(restart)"]
    free.free = True
    r.tick()
    r.tick()
    assert api.submitted == [job]


def submit(entrypoint: str = "true", **fields: Any) -> str:
    name = fields.pop("name", "j")
    request = JobRequest(
        id=f"{name}-{time.time_ns() % 10**8:08d}", name=name, cluster="c", entrypoint=entrypoint, **fields
    )
    return queue.enqueue(request, now=fields.pop("now", False)).id


def state(job_id: str) -> JobState:
    return read_job("c", job_id).state


def test_jobs_run_in_order_one_at_a_time_after_the_drain(home: Path) -> None:
    api, free = FakeApi(), Free()
    r = runner(api, free)
    a, b = submit(name="a"), submit(name="b")
    r.tick()
    assert api.submitted == [a] and state(a) is JobState.SUBMITTED and state(b) is JobState.QUEUED
    api.set(a, "RUNNING")
    r.tick()
    assert state(a) is JobState.RUNNING and api.submitted == [a]
    free.free = False
    api.set(a, "SUCCEEDED", 0)
    r.tick()
    assert state(a) is JobState.SUCCEEDED and api.submitted == [a]  # b waits for the drain
    r.tick()
    assert api.submitted == [a]
    free.free = True
    r.tick()  # the drain ends
    r.tick()
    assert api.submitted == [a, b] and queue.position("c", b) == 0
    assert queue.active("c") == [b]


def test_the_next_jobs_ledger_says_where_the_gap_went(home: Path) -> None:
    """Issue 43: the job that waited gets the times of the last end (in Ray, seen, closed,
    free) and of its own submit, in that order; a job given to an idle queue gets none."""
    api, free = FakeApi(), Free()
    r = runner(api, free)
    a, b = submit(name="a"), submit(name="b")
    r.tick()
    api.set(a, "RUNNING")
    r.tick()
    free.free = False
    api.set(a, "SUCCEEDED", 0)
    r.tick()
    free.free = True
    r.tick()
    r.tick()
    gap = read_job("c", b).gap
    assert gap is not None and gap["after"] == a, gap
    times = [gap[k] for k in ("ended", "seen", "closed", "free", "submit", "submitted")]
    assert times == sorted(times) and times[-1] - times[0] < 5, gap
    assert read_job("c", a).gap is None  # (queued to an idle queue: nothing before it)
    api.set(b, "SUCCEEDED", 0)
    r.tick()
    r.tick()
    later = submit(name="later")  # (queued after b ended: its wait is not a gap of the queue)
    r.tick()
    r.tick()
    assert api.submitted[-1] == later and read_job("c", later).gap is None


def test_retry_then_success_keeps_every_attempt(home: Path) -> None:
    api = FakeApi()
    r = runner(api)
    job = submit(retries=2)
    r.tick()
    api.set(job, "FAILED", 1)
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.SUBMITTED and record.attempt_ids == [job, f"{job}-retry1"]
    r.tick()
    r.tick()
    assert api.submitted == [job, f"{job}-retry1"]
    api.set(f"{job}-retry1", "SUCCEEDED", 0)
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.SUCCEEDED and [a.allocation for a in record.attempts] == ["100", "100"]
    assert paths.cluster("c").job_log(job, 2).read_text() == f"log of {job}-retry1\n"


def test_timeout_stops_and_fails(home: Path) -> None:
    api = FakeApi()
    r, job = running(api, timeout=1)
    clusters_record = read_job("c", job)
    assert clusters_record.state is JobState.RUNNING
    queue.finish  # noqa: B018 (the runner, not the test, records the end)
    from raystack.store.ledger import update_job

    update_job("c", job, started=time.time() - 5)
    r.tick()
    assert api.stopped == [job]
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.FAILED and "timed out after 1s" in record.message


def test_a_failed_job_is_named_by_the_first_error_ray_recorded_of_its_actors(home: Path) -> None:
    api = FakeApi()
    r, job = running(api)
    api.errors[f"ray-{job}"] = [
        {
            "ip": "10.0.0.8",
            "pid": 7,
            "actor": "Engine",
            "error": "ray::Engine.step()\nKeyError: 'a'",
            "at": 2.0,
        },
        {
            "ip": "10.0.0.7",
            "pid": 4121,
            "actor": "Learner",
            "error": "torch.OutOfMemoryError: CUDA",
            "at": 1.0,
        },
    ]
    node_entries.write_node_entry("c", "node7", {"ip": "10.0.0.7"})
    api.set(job, "FAILED", code=1)
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.FAILED
    assert record.message.startswith("node7 Learner pid 4121: torch.OutOfMemoryError: CUDA")
    assert record.actor_error == "node7 Learner pid 4121: torch.OutOfMemoryError: CUDA"
    assert record.attempts[-1].ray_job_id == f"ray-{job}"
    assert [w.host for w in workerlogs.read_index("c", job) or []] == ["node7", "10.0.0.8"]


def test_the_last_line_is_the_drivers_own_without_colour_codes(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text(
        "Traceback (most recent call last):\nValueError: boom on node3\n"
        "\x1b[36m(Worker pid=3300)\x1b[0m worker node1 starts\n"
        "\x1b[36m(Worker pid=9, ip=10.0.0.3)\x1b[0m more\n\n"
    )
    assert last_line(log) == "ValueError: boom on node3"
    log.write_text("\x1b[36m(Worker pid=3300)\x1b[0m only relayed lines\n")
    assert last_line(log) == "(Worker pid=3300) only relayed lines"
    log.write_text(  # (a job that printed nothing: Ray's preamble, with raystack's prefix, is no answer)
        "2026-11-24 19:52:24,269\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
        "Running entrypoint for job false-9a: unset RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES; false\n"
    )
    assert last_line(log) == ""


def test_stop_requested_before_submission_never_reaches_ray(home: Path) -> None:
    api = FakeApi()
    r = runner(api)
    job = submit()
    record = queue.start("c", queue.waiting("c")[0], "100")
    assert record is not None
    from raystack.store.ledger import update_job

    update_job("c", job, stop_requested=time.time())
    r.tick()
    assert api.submitted == [] and state(job) is JobState.STOPPED


def test_restarted_runner_follows_instead_of_submitting_again(home: Path) -> None:
    api = FakeApi()
    job = submit()
    runner(api).tick()
    assert api.submitted == [job]
    again = runner(api)  # a new runner process: nothing in memory
    again.tick()
    again.tick()
    assert api.submitted == [job]
    api.set(job, "SUCCEEDED", 0)
    again.tick()
    assert state(job) is JobState.SUCCEEDED


def test_foreign_submission_id_is_never_inherited(home: Path) -> None:
    """Ray already has a job with this id (another job's, whose ledger was lost): new id."""
    api = FakeApi()
    job = submit()
    api.ray[job] = Info(job_id="old", status="SUCCEEDED", metadata={"raystack_nonce": "someone-else"})
    r = runner(api)
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.QUEUED or record.state is JobState.SUBMITTED
    assert len(record.attempts) == 2 and record.attempts[1].id.startswith(f"{job}-")
    r.tick()
    assert api.submitted == [record.attempts[1].id]
    assert state(job) is JobState.SUBMITTED  # not the old job's SUCCEEDED


def test_orphans_of_an_ended_allocation_are_settled_not_resubmitted(home: Path) -> None:
    api = FakeApi()
    job = submit()
    assert queue.start("c", queue.waiting("c")[0], "99") is not None  # allocation 99 ended
    r = runner(api, allocation="100")
    r.tick()
    record = read_job("c", job)
    assert record.state is JobState.FAILED and "allocation 99 ended" in record.message
    assert api.submitted == [] and queue.active("c") == []


def test_now_job_starts_beside_a_running_one(home: Path) -> None:
    api = FakeApi()
    r = runner(api)
    long, queued = submit(name="long"), submit(name="queued")
    r.tick()
    api.set(long, "RUNNING")
    now = submit(name="now", now=True)
    r.tick()
    assert api.submitted == [long, now] and state(queued) is JobState.QUEUED


def test_bad_files_are_left_or_set_aside_by_the_writer_and_the_queue_keeps_going(home: Path) -> None:
    """A stray file in queue/ is left alone; an entry without a ledger is dropped; a ledger that
    the runner (a writer, with the lock) cannot read twice is the only thing set aside."""
    api = FakeApi()
    p = paths.cluster("c")
    good = submit(name="good")
    (p.queue / "junk").write_text("x")  # no '-': not a queue entry
    (p.queue / "100000000000000000000-ghost-1234").touch()  # no ledger
    broken = submit(name="broken")
    p.ledger(broken).write_text("{not json")
    r = runner(api)
    for _ in range(3):
        r.tick()
        api.set(good, "SUCCEEDED", 0) if good in api.ray else None
    assert state(good) is JobState.SUCCEEDED
    moved = sorted(x.name.split(".")[0] for x in p.corrupt.iterdir())
    assert moved == [f"jobs-{broken}"]
    assert (p.queue / "junk").read_text() == "x"
    assert queue.waiting("c") == []


def test_cancel_and_start_cannot_both_win(home: Path) -> None:
    job = submit()
    entry = queue.waiting("c")[0]
    queue.cancel("c", job)
    assert queue.start("c", entry, "100") is None
    assert state(job) is JobState.CANCELLED
    other = submit()
    entry = queue.waiting("c")[0]
    assert queue.start("c", entry, "100") is not None
    with pytest.raises(Exception, match="not queued"):
        queue.cancel("c", other)


def test_journal_delivers_only_changes(home: Path) -> None:
    reader = queue.JournalReader("c")
    assert reader.changes() == []
    job = submit()
    [(op, name)] = reader.changes()
    assert op == "+" and name.endswith(job)
    assert reader.changes() == []
    queue.cancel("c", job)
    assert [op for op, _ in reader.changes()] == ["-"]


def test_ids_are_never_reused_within_a_cluster(home: Path) -> None:
    first = queue.enqueue(JobRequest(id="x-1", name="x", cluster="c", entrypoint="a"))
    taken = JobRequest(id="x-1", name="x", cluster="c", entrypoint="b")
    second = queue.enqueue(taken, new_id=lambda name: f"{name}-2")
    assert (first.id, second.id) == ("x-1", "x-2")
    assert read_job("c", "x-1").request.entrypoint == "a"
    assert json.loads(paths.cluster("c").ledger("x-2").read_text())["request"]["entrypoint"] == "b"


def test_walltime_warning_interrupts_and_requeues_at_the_head(home: Path) -> None:
    """At the warning: the job in flight is stopped (SIGTERM via Ray), INTERRUPTED, back at the
    head of the queue with its original place; nothing else starts in this allocation."""
    api = FakeApi()
    r = runner(api)
    first, second = submit(name="first"), submit(name="second")
    r.tick()
    api.set(first, "RUNNING")
    r.tick()
    r.interrupt()
    r.tick()
    assert api.stopped == [first]  # Ray's stop: SIGTERM, SIGKILL after stop_grace
    r.tick()
    record = read_job("c", first)
    assert record.state is JobState.INTERRUPTED and record.interruptions == 1
    assert "stopped in allocation 100" in record.message and queue.active("c") == []
    assert [e.job_id for e in queue.waiting("c")] == [first, second]
    r.tick()
    assert api.submitted == [first]  # nothing more starts here
    # The next allocation resumes it first, as <id>-r1, with RAYSTACK_RESUME=1.
    nxt = runner(api, allocation="101")
    nxt.tick()
    record = read_job("c", first)
    assert record.attempt_ids == [first, f"{first}-r1"] and record.attempts[-1].allocation == "101"
    assert api.submitted == [first, f"{first}-r1"]
    env = api.env[f"{first}-r1"]
    assert env["RAYSTACK_RESUME"] == "1" and env["RAYSTACK_RESUME_COUNT"] == "1"


def test_a_job_that_succeeds_during_the_warning_is_not_interrupted(home: Path) -> None:
    api = FakeApi()
    r, job = running(api)
    r.interrupt()
    api.ray[job].status = "SUCCEEDED"  # it finished before the stop landed
    r.tick()
    assert state(job) is JobState.SUCCEEDED


def test_min_time_waits_for_a_longer_allocation_and_others_go_first(home: Path) -> None:
    clusters.update("c", walltime_end=int(time.time()) + 600)  # 10 minutes left
    api = FakeApi()
    r = runner(api)
    long = submit(name="long", min_time=3600)
    short = submit(name="short")
    r.tick()
    assert api.submitted == [short]
    assert "waits for an allocation with 1h00m left" in read_job("c", long).message
    assert queue.position("c", long) == 1
    clusters.update("c", walltime_end=int(time.time()) + 7200)
    later = runner(api, allocation="101")
    api.set(short, "SUCCEEDED", 0)
    later.tick()
    later.tick()
    assert api.submitted == [short, long]


def test_resume_request_is_what_an_interrupted_job_resumes_with(home: Path) -> None:
    api = FakeApi()
    request = JobRequest(id="t-1", name="t", cluster="c", entrypoint="python t.py")
    resumed = JobRequest(id="x", name="t", cluster="c", entrypoint="python t.py --resume", env={"R": "1"})
    queue.enqueue(request, resume_request=resumed)
    r = runner(api)
    r.tick()
    api.set("t-1", "RUNNING")
    r.tick()
    r.interrupt()
    r.tick()
    r.tick()
    runner(api, allocation="101").tick()
    assert api.entrypoints["t-1"].endswith("python t.py")
    assert api.entrypoints["t-1-r1"].endswith("python t.py --resume") and api.env["t-1-r1"]["R"] == "1"


def test_a_job_replanned_at_start_records_what_ran_and_says_so(home: Path) -> None:
    """The plan is filled in again at start, for the cluster as it is then: a node lost while
    the job waited changes it. The attempt keeps what Ray ran; the message says it changed."""
    plan = {"kind": "grpo", "learners": 2}
    entry = "python g.py --nodes {plan.nodes} --engines {plan.engines}"
    clusters.update("c", nodes_expected=2, gpus_per_node=4, cpus_per_node=64)
    planned = substitute(entry, PlanSpec.model_validate(plan), clusters.read("c"), "t")
    same = submit(entry, plan=plan, planned=planned)
    api = FakeApi()
    r = runner(api)
    r.tick()
    assert read_job("c", same).attempts[-1].entrypoint == planned == api.entrypoints[same].split("; ", 1)[1]
    assert "plan changed" not in read_job("c", same).message
    api.set(same, "SUCCEEDED", 0)
    r.tick()
    changed = submit(entry, plan=plan, planned=planned)
    clusters.update("c", nodes_expected=1)  # a node lost while it waited
    r.tick()
    r.tick()
    ran = read_job("c", changed)
    assert ran.attempts[-1].entrypoint == "python g.py --nodes 1 --engines 2" != planned, ran.attempts
    assert "its plan changed with the cluster since it was queued: python g.py --nodes 1" in ran.message


def test_passes_failing_for_a_minute_are_said_by_status_until_one_succeeds(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI at 1cf33c8: every pass failed for 15 minutes on one job's misread 404, and nothing but
    the runner's log said why the queue did not move. Now the lease carries it, and `raystack
    status` shows DEGRADED with the error (here FAILING and BEAT are 0: no minute to wait)."""
    from raystack.allocation.runner import lease as leases
    from raystack.client.status import DEGRADED, shown_state

    monkeypatch.setattr(leases, "FAILING", 0.0)
    monkeypatch.setattr(leases, "BEAT", 0.0)
    held = leases.Lease(paths.cluster("c"), allocation="100")
    assert held.acquire() is None
    r = Runner("c", api=FakeApi(), allocation="100", resources_free=Free(), sleep=lambda _: None)
    r.drain = None
    seen: list[tuple[str, str]] = []
    real_tick = r.tick

    def tick() -> None:
        seen.append(shown_state("c", clusters.read("c"), None))
        if len(seen) <= 2:
            raise RayApiError("Request failed with status code 500: boom")
        if len(seen) == 4:
            r.leave()
        real_tick()

    r.tick = tick  # type: ignore[method-assign]
    r.run_forever(held)
    assert seen[0][0] == "READY"  # (before any pass failed)
    state, message = seen[2]  # after two failed passes
    assert state == DEGRADED and "the queue runner's every pass has failed since" in message
    assert "status code 500: boom" in message and "queue-runner.log" in message
    assert seen[3][0] == "READY"  # a pass succeeded: said no more
    assert "failing" not in held.holder()


def test_the_loop_survives_a_failing_pass_and_leaves_on_sigterm(home: Path) -> None:
    """run_forever on a fake sleep: a pass that fails (a busy dashboard) waits a second and goes
    on; SIGTERM (leave) ends it after the pass in progress."""
    api, slept = FakeApi(), []
    job = submit()
    r = Runner("c", api=api, allocation="100", resources_free=Free(), sleep=slept.append)
    r.drain = None
    passes = []
    real_tick = r.tick

    def tick() -> None:
        passes.append(1)
        if len(passes) == 2:
            raise RayApiError("dashboard busy")
        if len(passes) == 4:
            r.leave()
        real_tick()

    r.tick = tick  # type: ignore[method-assign]
    r.run_forever()
    assert len(passes) == 4 and slept.count(1) == 1 and slept.count(TICK) == 4
    assert api.submitted == [job]


def test_a_failure_of_every_pass_is_logged_once_a_minute_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full filesystem failed every runner pass, a second apart: 19 log lines in 40 s (into a log
    on that same filesystem). Now: the first at once, then one a minute saying how many."""
    now = [0.0]
    said = Repeats(lambda: now[0], logging.getLogger("raystack.runner"), "runner pass")
    with caplog.at_level(logging.INFO, logger="raystack.runner"):
        for _ in range(130):  # 130 passes, a second apart
            said.failed("[Errno 28] No space left on device: '/shared/rs/clusters/c/ledger/x'")
            now[0] += 1.0
        said.failed("another")
        said.over()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5, lines
    assert lines[0].startswith("runner pass failed, retrying: [Errno 28]")
    assert lines[1].startswith("runner pass failed 60 more time(s) in 60s, retrying: [Errno 28]")
    assert lines[2].startswith("runner pass failed 60 more time(s) in 60s")
    assert lines[3] == "runner pass failed, retrying: another"
    assert lines[4].startswith("runner pass succeeds again")


def test_a_wait_that_ends_leaves_the_lease_at_once(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI: `status` still said "the next job waits for job X" after the next job had run, until
    the next heartbeat (BEAT seconds). A wait or a failure that ends is written at once."""
    from raystack.allocation.runner import lease as leases

    monkeypatch.setattr(leases, "WAITING", 0.0)
    monkeypatch.setattr(leases, "FAILING", 0.0)
    held = leases.Lease(paths.cluster("c"), allocation="100")
    assert held.acquire() is None
    held.beat(None, {"job": "x", "held": "actor a", "until": 0.0}, force=True)
    assert held.holder()["waiting"]["job"] == "x"
    held.beat("boom", {"job": "x", "held": "actor a", "until": 0.0}, force=True)
    assert "failing" in held.holder()
    held.beat(None, None)  # (within BEAT of the last write)
    assert "waiting" not in held.holder() and "failing" not in held.holder()


def test_the_allocations_first_runner_starts_before_ready_and_holds_nothing_back(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head starts the queue runner while it warms the cluster up; the runner takes its first
    pass once the record says READY, and the allocation's first runner has no job before it whose
    resources it must see released (that check held every new cluster's first job ~1 s)."""
    from raystack.allocation.runner.loop import FIRST_VAR

    assert (
        Runner("c", api=FakeApi(), allocation="100", resources_free=Free()).drain is not None
    )  # (a restart)
    monkeypatch.setenv(FIRST_VAR, "1")
    clusters.update("c", state=ClusterState.STARTING)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            clusters.update("c", state=ClusterState.READY)

    r = Runner("c", api=FakeApi(), allocation="100", resources_free=Free(), sleep=sleep)
    assert r.drain is None
    job = submit()
    passes: list[str] = []
    real_tick = r.tick

    def tick() -> None:
        passes.append(clusters.read("c").state.value)
        r.leave()
        real_tick()

    r.tick = tick  # type: ignore[method-assign]
    r.run_forever()
    assert r.api.warmed == 1  # (its own first submit paid while the cluster was STARTING, once)
    assert slept[:3] == [0.05] * 3 and passes == ["READY"]  # (no pass while STARTING)
    assert r.api.submitted == [job]  # (its first job at once)


def test_the_runner_warms_its_submit_path_again_until_the_jobs_api_answers(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started before the Jobs API answers (on the testbed it did not, yet): the warm-up of its
    own first submit is tried again every 0.5 s until it works, and not after."""
    from raystack.allocation.runner.loop import FIRST_VAR
    from raystack.waiting import FakeClock

    monkeypatch.setenv(FIRST_VAR, "1")
    clusters.update("c", state=ClusterState.STARTING)
    clock, api, answers = FakeClock(), FakeApi(), [False, False, True]

    def warm() -> bool:
        api.warmed = getattr(api, "warmed", 0) + 1
        return answers.pop(0) if answers else True

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        if clock.t > 1003:
            clusters.update("c", state=ClusterState.READY)

    api.warm = warm  # type: ignore[method-assign]
    r = Runner("c", api=api, allocation="100", resources_free=Free(), clock=clock.now, sleep=sleep)
    r.tick = r.leave  # type: ignore[method-assign, assignment]
    r.run_forever()
    assert api.warmed == 3 and clock.t > 1003
