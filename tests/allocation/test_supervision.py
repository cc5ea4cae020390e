"""The node programs never die of a surprise, and a dead head never holds the nodes: the head's
duties survive failing I/O, workers watch the head's heartbeat beside its GCS, and a worker that
finds the head's program gone settles the jobs in flight and ends the allocation. Fast: every
loop runs on a FakeClock (time moves only when the code sleeps)."""

from __future__ import annotations

import errno
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from raystack.adapters import slurm
from raystack.allocation.head import program as head_mod
from raystack.allocation.node import worker
from raystack.allocation.node.context import NodeContext
from raystack.allocation.node.duties import FolderWatch, GpuReport, Heartbeat
from raystack.allocation.node.gpus import parse_compute_apps
from raystack.allocation.node.rayproc import why_ray_ended
from raystack.store import cluster as clusters
from raystack.store import node_entries, paths, queue
from raystack.store.cluster import ClusterRecord, ClusterState, read_heartbeat
from raystack.store.ledger import JobRequest, JobState, read_job
from raystack.waiting import Backoff, Every, FakeClock, Guarded, poll_until


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    clusters.write(
        ClusterRecord(
            name="c",
            state=ClusterState.READY,
            allocation_id="7",
            gcs_address="10.0.0.1:6379",
            head_host="node1",
        )
    )
    return tmp_path


def ctx(tmp_path: Path, node_id: int = 1) -> NodeContext:
    return NodeContext(
        cluster="c",
        alloc_id="7",
        node_id=node_id,
        num_nodes=4,
        host=f"node{node_id + 1}",
        ip=f"10.0.0.{node_id + 1}",
        gpus=0,
        cpus=4,
        temp_dir=tmp_path / "t",
        object_store_bytes=2**28,
        join_timeout=120,
    )


class FakeRay:
    """What the loops ask of a RayProcess."""

    def __init__(self, alive_for: int = 10**9):
        self.left = alive_for
        self.proc = subprocess.Popen(["true"])
        self.proc.wait()
        self.stopped = False

    def alive(self) -> bool:
        self.left -= 1
        return self.left >= 0

    def stop(self, grace: float = 10.0) -> None:
        self.stopped = True


# ---------------------------------------------------------------------------- waiting
def test_every_backoff_and_poll_until_run_on_a_fake_clock() -> None:
    clock = FakeClock()
    gate = Every(5, clock)
    assert gate() and not gate()
    clock.advance(5)
    assert gate()
    back = Backoff(first=1, cap=8, jitter=0.0)
    assert [back.next() for _ in range(5)] == [1, 2, 4, 8, 8]
    back.reset()
    assert back.next() == 1
    calls = []
    assert poll_until(lambda: calls.append(1) or (len(calls) > 3 and "done"), 10, "x", clock) == "done"
    with pytest.raises(Exception, match="timed out after 2s waiting for never"):
        poll_until(lambda: None, 2, "never", clock)
    with pytest.raises(Exception, match="gone while waiting for x"):
        poll_until(lambda: None, 60, "x", clock, abort=lambda: "gone")


def test_a_guarded_duty_logs_backs_off_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    clock, calls, failing = FakeClock(), [], [True]

    def duty() -> str:
        calls.append(clock.now())
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return "ok"

    guard = Guarded("usage sample", duty, logging.getLogger("t"), clock, cap=8)
    with caplog.at_level(logging.INFO, "t"):
        for _ in range(60):
            guard()
            clock.advance(1)
        failed = len(calls)
        failing[0] = False
        for _ in range(20):
            guard()
            clock.advance(1)
    assert failed < 20  # it backed off (up to 8 s) instead of failing every second
    assert len(calls) - failed >= 12  # once its back-off (<= 8 s) is over, it runs every time again
    assert guard.failures == 0 and "works again" in caplog.text and "No space left" in caplog.text


# ---------------------------------------------------------------------------- parsers
def test_nvidia_smi_fields_it_cannot_fill_are_not_errors() -> None:
    """cde9410: int('[N/A]') from a MIG GPU raised a ValueError every second once a job held GPU
    memory, and it ended the head's node program."""
    out = "1234, [N/A]\n5678, 2048\n91011, [Insufficient Permissions]\nNo running processes found\n\n"
    assert parse_compute_apps(out) == [(1234, 0), (5678, 2048), (91011, 0)]


# ---------------------------------------------------------------------------- heartbeat
def test_the_heads_end_names_the_ray_daemon_that_died_and_how(tmp_path: Path) -> None:
    """As `ray start --block` (2.5x) writes it when its GCS is SIGKILLed (colours and all)."""
    log = tmp_path / "node-node1.log"
    log.write_text(
        "x"
        * 70000
        + "\n2026-11-25 01:23:40,153\tERR scripts.py:1307 -- \x1b[31mSome Ray subprocesses exited "
        "unexpectedly:\x1b[39m\n2026-11-25 01:23:40,154\tERR scripts.py:87 -- \x1b[31m\x1b[1mgcs_server"
        "\x1b[22m\x1b[26m\x1b[39m\x1b[0m\x1b[2m [exit code=-9]\x1b[22m\x1b[0m\n"
        "2026-11-25 01:23:40,154\tERR scripts.py:87 -- raylet [exit code=1]\n"
    )
    said = head_mod.head_exited(1, log)
    died = "gcs_server killed by SIGKILL, raylet exited with code 1 (SIGKILL: most often the kernel's"
    assert said.startswith(f"the Ray head exited with code 1; see {log}: {died}"), said
    log.write_text("ray start: nothing said\n")
    assert head_mod.head_exited(1, log) == f"the Ray head exited with code 1; see {log}"
    assert why_ray_ended(tmp_path / "missing.log") == ""


def test_the_heartbeat_is_rewritten_in_place(home: Path) -> None:
    clock = FakeClock()
    beat = Heartbeat(ctx(home, 0), clock, every=5)
    beat()
    first = paths.cluster("c").heartbeat.stat()
    one = read_heartbeat("c")
    clock.advance(5)
    beat()
    two = read_heartbeat("c")
    assert one and two and one["allocation"] == "7" and two["n"] == one["n"] + 1
    after = paths.cluster("c").heartbeat.stat()
    assert after.st_ino == first.st_ino and after.st_size == first.st_size  # no new file, no new block


def test_a_gpu_report_is_written_only_when_it_changes(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raystack.allocation.node import duties

    writes: list[dict] = []
    monkeypatch.setattr(duties, "real_gpus", lambda: True)
    held = [[(11, 500)]]
    monkeypatch.setattr(duties, "gpu_processes", lambda: held[0])
    monkeypatch.setattr(duties.node_entries, "write_node_entry", lambda c, h, e: writes.append(dict(e)))
    clock, c = FakeClock(), ctx(home, 0)
    c.gpus = 4
    report = GpuReport(c, every=1, refresh=30, clock=clock)
    for _ in range(20):
        report()
        clock.advance(1)
    held[0] = []
    for _ in range(45):
        report()
        clock.advance(1)
    # the first report, the change, one refresh of the unchanged report: never once a second
    assert [w["gpu_procs"] for w in writes] == [[(11, 500)], [], []]
    assert {w["gpu_every"] for w in writes} == {1}  # (the runner's wait after a job's end)


def test_gpus_are_asked_through_nvml_where_it_loads_else_through_nvidia_smi(home: Path) -> None:
    """No NVIDIA driver here: NVML does not initialise, so nvidia-smi (if any) would be asked once a
    second; with neither, nothing is asked and nothing is held."""
    from raystack.allocation.node import gpus

    assert gpus.nvml() is None  # (the binding is installed; the driver is not)
    expected = "nvidia-smi" if shutil.which("nvidia-smi") else None
    assert gpus.source() == expected
    assert GpuReport(ctx(home)).every == gpus.CHECK_EVERY["nvidia-smi"]
    if expected is None:
        assert gpus.compute_apps() == [] and gpus.gpu_processes() == [] and gpus.gpu_usage() == []


# ---------------------------------------------------------------------------- workers watch the head
class Beats:
    """A head's heartbeat as a worker reads it: changing while the head lives."""

    def __init__(self) -> None:
        self.n, self.alive = 0, True

    def __call__(self, _cluster: str) -> dict[str, Any]:
        if self.alive:
            self.n += 1
        return {"allocation": "7", "n": self.n}


def test_a_head_whose_program_and_gcs_are_gone_is_lost_within_half_a_minute(home: Path) -> None:
    clock, beats, gcs = FakeClock(), Beats(), [True]
    watch = worker.HeadWatch(ctx(home), "10.0.0.1:6379", clock, lambda h, p: gcs[0], beats)
    for _ in range(120):
        assert watch() is None
        clock.advance(1)
    beats.alive, gcs[0] = False, False  # the head's node program was SIGKILLed: Ray went with it
    t0 = clock.now()
    while (verdict := watch()) is None:
        clock.advance(1)
    assert verdict[0] == "lost" and "silent" in verdict[1]
    assert clock.now() - t0 <= worker.BEAT_STALE + worker.RECORD_EVERY + 1


def test_a_gcs_blip_or_a_silent_filesystem_alone_does_not_end_the_cluster(home: Path) -> None:
    clock, beats, gcs = FakeClock(), Beats(), [False]
    watch = worker.HeadWatch(ctx(home), "10.0.0.1:6379", clock, lambda h, p: gcs[0], beats)
    for _ in range(50):  # the GCS does not answer for 50 s while the head beats: a blip
        assert watch() is None
        clock.advance(1)
    gcs[0] = True
    beats.alive = False  # the head cannot write (a full quota): its GCS answers
    for _ in range(int(worker.HEAD_HUNG) - 10):
        assert watch() is None
        clock.advance(1)
    gcs[0], beats.alive = False, True  # the GCS gone for good while the head's program lives
    while (verdict := watch()) is None:
        clock.advance(1)
    assert verdict[0] == "unreachable"


def test_the_record_saying_the_end_and_another_allocations_beat(home: Path) -> None:
    clock = FakeClock()
    old_beat = {"allocation": "6", "n": 1}  # the last allocation's head wrote it: no beat of ours
    watch = worker.HeadWatch(ctx(home), "10.0.0.1:6379", clock, lambda h, p: False, lambda c: old_beat)
    verdicts = []
    for _ in range(int(worker.BEAT_STALE) + 10):
        verdicts.append(watch())
        clock.advance(1)
    assert [v[0] for v in verdicts if v][:1] == ["lost"]
    clusters.update("c", state=ClusterState.STOPPED)
    watch = worker.HeadWatch(ctx(home), "10.0.0.1:6379", clock, lambda h, p: True, Beats())
    assert watch() == ("ended", "the head recorded the cluster's end")


def test_a_worker_that_finds_the_head_gone_settles_the_jobs_and_cancels(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cde9410: a SIGKILLed head left Ray and the workers holding the allocation until the walltime
    (the workers probed only the GCS port, and waited for a head that never came back)."""
    request = JobRequest(id="j-1", name="j", cluster="c", entrypoint="true")
    queue.enqueue(request)
    queue.start("c", queue.waiting("c")[0], "7")
    cancelled: list[str] = []
    monkeypatch.setattr(slurm, "scancel", cancelled.append)
    clock, beats, gcs = FakeClock(), Beats(), [True]
    node = worker.Worker(ctx(home), clusters.read("c"), clock, lambda h, p: gcs[0], start_ray=FakeRay)
    node.watch.beat = beats
    node.duties = []
    clock.advance(30)
    beats.alive, gcs[0] = False, False
    assert node.run() == 0
    assert cancelled == ["7"]
    record = clusters.read("c")
    assert record.state is ClusterState.FAILED and "silent" in record.message
    job = read_job("c", "j-1")
    assert job.state is JobState.INTERRUPTED and queue.active("c") == []  # it resumes next time


def test_a_worker_whose_ray_dies_while_the_head_lives_rejoins(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a worker's raylet killed (kill -9 on the testbed; the OOM killer on a real node) made
    its node program leave while the head lived: the cluster stayed at 1 of 2 nodes and SLURM held
    the node idle until the walltime. Now it rejoins; a Ray that keeps dying is given up on."""
    clock, started = FakeClock(), []

    def start(lives: int) -> FakeRay:
        started.append(clock.now())
        return FakeRay(alive_for=lives)

    lives = int(50 / worker.POLL)  # (alive() is asked once per loop of POLL s)
    node = worker.Worker(ctx(home), clusters.read("c"), clock, lambda h, p: True, lambda: start(lives))
    node.watch.beat, node.duties = Beats(), []
    with caplog.at_level(logging.WARNING, "raystack.node"):
        assert node.run() == 0  # dies every ~50 s: REJOINS rejoins, then it leaves
    assert len(started) == 1 + worker.REJOINS
    assert caplog.text.count("while the head lives; it rejoins") == worker.REJOINS
    assert f"the {worker.REJOINS + 1} time in 600 s; leaving" in caplog.text

    def seldom() -> FakeRay:  # dies every ~400 s: always rejoins, until the head records the end
        if len(started) == 10:
            clusters.update("c", state=ClusterState.STOPPED)
        return start(int(400 / worker.POLL))  # (alive() is asked once per loop of POLL s)

    started.clear()
    caplog.clear()
    node = worker.Worker(ctx(home), clusters.read("c"), clock, lambda h, p: True, start_ray=seldom)
    node.watch.beat, node.duties = Beats(), []
    with caplog.at_level(logging.WARNING, "raystack.node"):
        assert node.run() == 0
    assert len(started) >= 10 and "leaving" not in caplog.text  # (the end is read every RECORD_EVERY)


# ---------------------------------------------------------------------------- the head's loop
def test_the_heads_duties_survive_a_full_filesystem_and_a_bug(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """cde9410: any OSError of periodic I/O (a usage sample, a node entry) ended the allocation
    and the jobs in flight became FAILED; a ValueError from a parser did too."""
    clock = FakeClock()
    c = ctx(home, 0)
    h = head_mod.Head(c, FakeRay(alive_for=400), clock=clock)  # type: ignore[arg-type]
    monkeypatch.setattr(h, "keep_runner", lambda: None)

    def full(*_: object) -> None:
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    def bug() -> None:
        raise ValueError("invalid literal for int() with base 10: '[N/A]'")

    h.sample = full  # type: ignore[assignment]
    h.report = bug  # type: ignore[assignment]
    monkeypatch.setattr(head_mod, "prune", full)
    with caplog.at_level(logging.INFO, "raystack.node"):
        end = h.supervise()
    # only Ray's end ended it; a crash, so the jobs in flight resume (before: "failed", FAILED)
    assert end.kind == "crashed" and "the Ray head exited" in end.text
    assert end.requeue and end.chain_goes_on
    assert "Disk quota exceeded" in caplog.text and "invalid literal" in caplog.text
    beat = read_heartbeat("c")
    assert beat is not None and beat["n"] > 10  # it kept beating all along


def test_a_head_whose_cluster_folder_is_removed_ends_after_the_grace(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ce305fe: after `rm -rf` of a running cluster's folder (by hand, a scratch purge) nothing
    could find or stop it; a one-node or local cluster held its node until the walltime (a larger
    one's workers ended it after 5 minutes, taking the missing heartbeat for a dead head)."""
    cancelled: list[str] = []
    monkeypatch.setattr(slurm, "scancel", cancelled.append)
    clusters.update("c", next_allocation_id="8")  # a chain's pending follow-on
    clock, c = FakeClock(), ctx(home, 0)
    c.folder_grace = 120
    gone_at: list[float] = []

    class Removed(FakeRay):
        def alive(self) -> bool:  # (a look of the loop: the folder goes after 50 of them)
            if self.left == 1000 - 50:
                shutil.rmtree(paths.cluster("c").root)
                gone_at.append(clock.now())
            return super().alive()

    h = head_mod.Head(c, Removed(alive_for=1000), clock=clock)  # type: ignore[arg-type]
    monkeypatch.setattr(h, "keep_runner", lambda: None)
    monkeypatch.setattr(h, "check_idle", lambda: None)
    end = h.supervise()
    assert gone_at and 120 <= clock.now() - gone_at[0] <= 120 + 30  # the grace, then one look's cadence
    assert end.kind == "failed" and "gone" in end.text and "scratch purge" in end.text
    assert cancelled == ["8"] and "follow-on 8 is cancelled" in end.text
    assert not paths.cluster("c").root.exists()  # nothing made it again


def test_a_folder_gone_for_less_than_the_grace_or_unreadable_ends_nothing(home: Path) -> None:
    clock = FakeClock()
    watch = FolderWatch(ctx(home, 0), grace=120, every=15, clock=clock)
    record = paths.cluster("c").record
    saved = record.read_bytes()
    record.unlink()
    for _ in range(6):  # 90 s missing
        assert watch() is None
        clock.advance(15)
    record.write_bytes(saved)  # back (a filesystem that came back): the count starts again
    assert watch() is None and watch.missing_since is None
    record.write_bytes(b"{not json")  # unreadable is not removed: the look raises, Guarded backs off
    clock.advance(15)
    with pytest.raises(clusters.UnreadableRecord):
        watch()


def test_a_run_of_a_requeued_allocation_waits_for_its_own_head(home: Path) -> None:
    """SLURM ran the requeued allocation 7 again: the record still shows its earlier run's end
    (STOPPED). Before, the workers read that as the cluster's end and left."""
    clusters.update("c", state=ClusterState.STOPPED, gcs_address=None)
    again = ctx(home)
    again.restart = 1
    assert worker.head_record(again) is None  # the earlier run's: wait for this run's head
    clusters.update("c", allocation_restart=1, state=ClusterState.STARTING, gcs_address="10.0.0.1:6380")
    record = worker.head_record(again)
    assert record is not None and record.gcs_address == "10.0.0.1:6380" and worker.joining(again)
    assert worker.head_record(ctx(home)) is None  # (the earlier run's worker, were it still there)


def test_the_head_tells_a_requeue_from_a_scancel(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {"7": 0}
    monkeypatch.setattr(slurm, "restart_count", lambda alloc_id: counts[alloc_id])
    h = head_mod.Head(ctx(home, 0), FakeRay())  # type: ignore[arg-type]
    assert h.requeued() is None  # a SIGTERM with the count unchanged: scancel, walltime, ...
    counts["7"] = 1
    end = h.requeued()
    assert end is not None and end.kind == "requeued" and end.requeue and end.chain_goes_on
    h.ctx.restart = 1  # (this run is the restarted one: the count is its own)
    assert h.requeued() is None


def test_the_restarted_runs_head_claims_the_cluster_and_resumes_the_earlier_runs_jobs(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The earlier run was SIGKILLed (no end recorded): its job is still in flight under
    allocation 7, which is this run's id too; before it starts anything, the head puts it back."""
    request = JobRequest(id="j-3", name="j", cluster="c", entrypoint="true")
    queue.enqueue(request)
    queue.start("c", queue.waiting("c")[0], "7")
    clusters.update("c", state=ClusterState.SUBMITTED)
    monkeypatch.setattr(slurm, "scancel", lambda alloc_id: None)
    seen: list[JobState] = []

    class Started(head_mod.Head):
        @classmethod
        def start(cls, c: NodeContext) -> head_mod.Head:
            seen.append(read_job("c", "j-3").state)  # (what the claim and the settling left)
            raise head_mod.Stop("enough")

    monkeypatch.setattr(head_mod, "Head", Started)
    again = ctx(home, 0)
    again.restart = 1
    head_mod.run_head(again)
    assert seen == [JobState.INTERRUPTED] and queue.position("c", "j-3") == 1
    assert clusters.read("c").allocation_restart == 1


def test_a_lost_node_that_rejoins_is_said_back(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`node lost: node4; running on without it` stayed in the record after the node's Ray rejoined."""
    clock, missing = FakeClock(), [["node4"]]
    h = head_mod.Head(ctx(home, 0), FakeRay(), clock=clock)  # type: ignore[arg-type]
    monkeypatch.setattr(head_mod, "missing_nodes", lambda c, alive: missing[0])

    class Alive:
        def alive_nodes(self) -> list[Any]:
            return []

    clusters.update("c", dashboard_url="http://10.0.0.1:8265")
    h.nodes.dashboard = Alive()  # type: ignore[assignment]
    for _ in range(8):  # 40 s missing: over the 30 s grace
        h.watch_nodes()
        clock.advance(5)
    assert clusters.read("c").message == "node lost: node4; running on without it"
    missing[0] = []
    clock.advance(5)
    h.watch_nodes()
    assert clusters.read("c").message == "node back: node4; all 4 nodes in Ray"
    assert clusters.read("c").state is ClusterState.READY


def test_an_unexpected_error_ends_the_allocation_with_ray_stopped_and_jobs_requeued(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = JobRequest(id="j-2", name="j", cluster="c", entrypoint="true")
    queue.enqueue(request)
    queue.start("c", queue.waiting("c")[0], "7")
    cancelled: list[str] = []
    monkeypatch.setattr(slurm, "scancel", cancelled.append)
    ray = FakeRay()

    class Broken(head_mod.Head):
        @classmethod
        def start(cls, c: NodeContext) -> head_mod.Head:
            return cls(c, ray)  # type: ignore[arg-type]

        def until_ready(self) -> None:
            pass

        def supervise(self) -> Any:
            raise KeyError("a bug in the loop")

    monkeypatch.setattr(head_mod, "Head", Broken)
    monkeypatch.setattr(head_mod, "claim", lambda c: False)
    assert head_mod.run_head(ctx(home, 0)) == 1
    assert ray.stopped and cancelled == ["7"]
    assert read_job("c", "j-2").state is JobState.INTERRUPTED
    assert clusters.read("c").state is ClusterState.FAILED


def test_the_runner_gets_sigterm_and_time_before_sigkill(home: Path) -> None:
    h = head_mod.Head(ctx(home, 0), FakeRay())  # type: ignore[arg-type]
    h.runner = subprocess.Popen(
        [
            "python3",
            "-c",
            "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            "print('ready', flush=True)\ntime.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert h.runner.stdout is not None and h.runner.stdout.readline().strip() == "ready"
    h.stop_runner()
    assert h.runner.returncode == 7  # it left on SIGTERM, by its own handler


# ---------------------------------------------------------------------------- the head's wait
class JoiningDashboard:
    """Ray's view while nodes join: one more node every `every` polls, up to `upto`."""

    def __init__(self, upto: int, every: int = 3):
        self.upto, self.every, self.polls, self.probed = upto, every, 0, 0

    def alive_nodes(self) -> list[Any]:
        from raystack.adapters.ray import NodeSummary

        self.polls += 1
        n = min(self.upto, 1 + self.polls // self.every)
        return [NodeSummary(f"n{i}", f"10.0.0.{i + 1}", i == 0, {"CPU": 4.0}) for i in range(n)]

    def probe(self) -> str | None:
        self.probed += 1
        return None


def test_the_head_waits_while_nodes_join_and_the_deadline_moves_with_progress(home: Path) -> None:
    """join_timeout bounds the time without a node joining, not the whole start: 4 nodes one
    every 3 polls take longer than join_timeout in all and still make it."""
    clock, c = FakeClock(), ctx(Path(home), node_id=0)
    clusters.update("c", nodes=["node1", "node2", "node3", "node4"])
    c.join_timeout = 1.0  # (3 polls of POLL s each pass between two joins: more than 1 s in all)
    dash = JoiningDashboard(upto=4)
    start = clock.now()
    head_mod.wait_ready(c, dash, FakeRay(), clock=clock)  # type: ignore[arg-type]
    assert dash.probed == 1 and clock.now() - start > c.join_timeout
    assert clusters.read("c").nodes_joined == 4


def test_the_head_gives_up_when_no_node_joins_for_join_timeout(home: Path) -> None:
    clock, c = FakeClock(), ctx(Path(home), node_id=0)
    clusters.update("c", nodes=["node1", "node2", "node3", "node4"])
    for i, host in enumerate(["node1", "node2", "node3", "node4"]):
        node_entries.write_node_entry("c", host, {"ip": f"10.0.0.{i + 1}"})
    c.join_timeout = 5.0
    dash = JoiningDashboard(upto=2)
    with pytest.raises(Exception, match="node3"):  # named with its log
        head_mod.wait_ready(c, dash, FakeRay(), clock=clock)  # type: ignore[arg-type]
    assert 5.0 < clock.now() - 1000.0 < 5.0 + 3 * (2 * 3 * head_mod.POLL)
    with pytest.raises(Exception, match="Ray head exited"):
        head_mod.wait_ready(c, JoiningDashboard(upto=4), FakeRay(alive_for=2), clock=clock)  # type: ignore[arg-type]
