"""The cluster folder when things race or fail: readers never move or lose anything, files appear
complete or not at all, every transaction leaves a job somewhere, and the lock works where flock
does not (Lustre without `flock`) or cannot be trusted (node-local locks).

Each case was reproduced on cde9410 (before these fixes) and failed there as the test says.
"""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raystack.cli.common import app
from raystack.client import Job
from raystack.errors import ClusterError, ConfigError
from raystack.store import claims, files, paths, queue, recovery
from raystack.store import cluster as clusters
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRequest, JobState, Unreadable, all_jobs, read_job, update_job

from ..conftest import wait_until


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.READY, allocation_id="99999991"))
    return tmp_path


def submit(name: str = "j") -> str:
    request = JobRequest(id=f"{name}-{time.time_ns() % 10**9:09d}", name=name, cluster="c", entrypoint="true")
    return queue.enqueue(request).id


# ---------------------------------------------------------------------------- readers
def test_a_job_id_that_is_a_path_is_refused_and_the_record_stays(home: Path) -> None:
    """cde9410: `raystack logs ../cluster` read clusters/c/jobs/../cluster.json, found it no job
    record and moved cluster.json into corrupt/: the head then cancelled the allocation."""
    record = paths.cluster("c").record
    before = record.read_bytes()
    for bad in ("../cluster", "..", "a/b", "", ".hidden"):
        with pytest.raises(ConfigError, match="is not a job id"):
            Job.get(bad, "c")
    result = CliRunner().invoke(app, ["logs", "../cluster", "-c", "c"])
    assert result.exit_code != 0
    assert record.read_bytes() == before and not paths.cluster("c").corrupt.exists()


def test_states_and_fields_of_another_version_are_kept_and_shown(home: Path) -> None:
    """cde9410: a ledger or record holding a state this version does not know (a login node's
    venv upgraded while a cluster runs) was moved aside by `raystack list` and `queue`."""
    job = submit()
    p = paths.cluster("c")
    data = json.loads(p.ledger(job).read_text())
    data.update(state="PAUSED", priority=7)
    p.ledger(job).write_text(json.dumps(data))
    rec = json.loads(p.record.read_text())
    rec.update(state="HIBERNATING", backend="slurm")
    p.record.write_text(json.dumps(rec))

    view = queue.view("c", every=True)
    assert [r.state.value for r in view.records] == ["PAUSED"]
    assert not view.records[0].state.known and not view.records[0].state.is_terminal()
    assert clusters.read("c").state.value == "HIBERNATING"
    update_job("c", job, message="touched by this version")
    clusters.update("c", message="so was this")
    again = json.loads(p.ledger(job).read_text())
    assert again["state"] == "PAUSED" and again["priority"] == 7  # written back as it was
    assert json.loads(p.record.read_text())["backend"] == "slurm"
    result = CliRunner().invoke(app, ["queue", "c", "--all", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["state"] == "PAUSED"
    assert not p.corrupt.exists()


def test_an_unreadable_ledger_is_reported_and_left_where_it_is(home: Path) -> None:
    job = submit()
    p = paths.cluster("c")
    p.ledger(job).write_text("{half a rec")
    with pytest.raises(Unreadable, match="left at"):
        read_job("c", job)
    assert all_jobs("c") == [] and queue.view("c", every=True).records == []
    assert p.ledger(job).read_text() == "{half a rec" and not p.corrupt.exists()
    (p.queue / "not-an-entry").write_text("x")
    assert queue.waiting("c") == queue.waiting("c") and (p.queue / "not-an-entry").exists()
    p.record.write_text("{")
    with pytest.raises(ClusterError, match="cannot be read"):
        clusters.read("c")
    assert p.record.read_text() == "{"  # cluster.json is never moved


def test_a_listing_racing_submits_loses_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cde9410: the ledger was created empty (O_EXCL) and then written; `queue --all` in between
    found it unreadable and moved it aside, and the runner dropped the job (63 of 200 lost with a
    5 ms create-to-write gap, as on NFS). Now it is linked into place complete."""
    real_fdopen = os.fdopen

    def slow_fdopen(fd: int, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        time.sleep(0.005)  # the gap between creating a file and writing it
        return real_fdopen(fd, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fdopen", slow_fdopen)
    stop = threading.Event()
    seen_errors: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for record in queue.view("c", every=True).records:
                assert record.state is JobState.QUEUED
            try:
                for job_id in [e.job_id for e in queue.waiting("c")]:
                    read_job("c", job_id)
            except ClusterError as exc:
                seen_errors.append(str(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        ids = [submit(f"j{i}") for i in range(120)]
    finally:
        stop.set()
        thread.join()
    assert seen_errors == []
    assert sorted(e.job_id for e in queue.waiting("c")) == sorted(ids)
    assert all(read_job("c", j).state is JobState.QUEUED for j in ids)
    assert not paths.cluster("c").corrupt.exists()


def test_create_exclusive_is_complete_or_absent(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    assert files.create_exclusive(target, '{"a": 1}')
    assert not files.create_exclusive(target, '{"a": 2}')
    assert json.loads(target.read_text()) == {"a": 1} and oct(target.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary file left


# ---------------------------------------------------------------------------- transactions
def test_a_start_cut_short_leaves_the_job_startable(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cde9410: start() deleted the queue file before it created active/<id>; a runner killed in
    between stranded a QUEUED job nobody would ever run."""
    job = submit()
    entry = queue.waiting("c")[0]

    def killed(*_: object, **__: object) -> None:
        raise KeyboardInterrupt("runner killed")

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(queue, "change_job", killed)
        queue.start("c", entry, "100")
    assert queue.waiting("c") == [entry]  # still queued (and marked active: started on)
    record = queue.start("c", entry, "100")
    assert record is not None and record.attempt_ids == [job]
    assert queue.waiting("c") == [] and queue.active("c") == [job]
    assert queue.start("c", entry, "100") is None  # (nothing to start twice)


def test_a_start_that_recorded_its_attempt_is_not_started_twice(home: Path) -> None:
    job = submit()
    entry = queue.waiting("c")[0]
    record = queue.start("c", entry, "100")
    assert record is not None
    (paths.cluster("c").queue / entry.name).touch()  # killed before the queue file went
    assert queue.start("c", entry, "100") is None
    assert read_job("c", job).attempt_ids == [job] and queue.waiting("c") == []


def test_a_cancel_cut_short_is_finished_by_the_next_start(home: Path) -> None:
    job = submit()
    entry = queue.waiting("c")[0]
    update_job("c", job, state=JobState.CANCELLED)  # the ledger first, then the queue file
    assert queue.start("c", entry, "100") is None
    assert queue.waiting("c") == [] and read_job("c", job).state is JobState.CANCELLED


def test_recover_puts_stranded_jobs_back_in_their_place(home: Path) -> None:
    first, stranded, last = submit("a"), submit("b"), submit("c")
    p = paths.cluster("c")
    entry = read_job("c", stranded).entry
    (p.queue / str(entry)).unlink()  # what cde9410's start could leave
    assert [e.job_id for e in queue.waiting("c")] == [first, last]
    assert recovery.recover("c") == [stranded]
    assert [e.job_id for e in queue.waiting("c")] == [first, stranded, last]
    assert recovery.recover("c") == []


# ---------------------------------------------------------------------------- locks
def _count(folder: str, rounds: int) -> None:
    os.environ["RAYSTACK_HOME"] = folder
    p = paths.cluster("c")
    for _ in range(rounds):
        with files.locked(p):
            counter = Path(folder) / "counter"
            value = int(counter.read_text() or 0) if counter.exists() else 0
            time.sleep(0.0005)
            counter.write_text(str(value + 1))


def test_link_locks_exclude_each_other_across_processes(home: Path) -> None:
    p = paths.cluster("c")
    files.use_link_locks(p, "test")
    assert files.uses_link_locks(p)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_count, args=(str(home / "rs"), 40)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    assert (home / "rs" / "counter").read_text() == "160"
    assert not p.link_lock.exists()


def test_without_flock_the_queue_works_on_link_locks(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cde9410: on Lustre mounted without `flock` every command ended in a 69-line traceback
    (ENOSYS from flock)."""
    real = fcntl.flock

    def no_flock(fd: object, op: int) -> None:
        if op & fcntl.LOCK_EX or op & fcntl.LOCK_SH:
            raise OSError(errno.ENOSYS, "Function not implemented")
        real(fd, op)  # type: ignore[arg-type]

    monkeypatch.setattr(fcntl, "flock", no_flock)
    job = submit()
    assert queue.cancel("c", job).state is JobState.CANCELLED
    other = submit()
    assert queue.start("c", queue.waiting("c")[0], "100") is not None
    assert queue.active("c") == [other] and files.uses_link_locks(paths.cluster("c"))


def test_a_link_lock_left_by_a_dead_holder_is_broken(home: Path) -> None:
    p = paths.cluster("c")
    p.link_lock.write_text('{"host": "gone", "pid": 1}')
    old = time.time() - 1000
    os.utime(p.link_lock, (old, old))
    with files.link_lock(p.link_lock, lease=60):
        assert p.link_lock.exists()
    assert not p.link_lock.exists()


def test_the_heads_probe_lock_tells_whether_locks_are_shared(home: Path) -> None:
    p = paths.cluster("c")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom raystack.store import files, paths\n"
            "fh = files.hold_probe(paths.cluster('c'), '99999991')\n"
            "print('held', flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert files.lock_seen(p, "99999991") is True  # one kernel: locks are shared
        assert files.lock_seen(p, "another-allocation") is None  # not that head's: cannot tell
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: the lock can be taken, which from another host would mean node-local
    # locks (the client asks only while the head's heartbeat is fresh).
    assert files.lock_seen(p, "99999991") is False


def test_a_message_that_looks_like_markup_is_shown_as_it_is(home: Path) -> None:
    """cde9410: a last log line holding `[/scratch/ckpt]` made `raystack queue` fail with a
    MarkupError, and `[rank0]:` disappeared from it."""
    job = submit()
    update_job("c", job, message="[rank0]: saved to [/scratch/ckpt] [bold]x[/bold]")
    result = CliRunner().invoke(app, ["queue", "c"])
    assert result.exit_code == 0, result.output
    assert "[rank0]: saved to [/scratch/ckpt] [bold]x[/bold]" in result.stdout


def test_a_record_of_schema_1_is_read_as_schema_2(home: Path) -> None:
    """Records written before backends: slurm_job_id/next_job_id, a local cluster told by its id's
    prefix, allocations keyed job_id. Read as they meant, written back in the new form."""
    for old, backend in (("12345", "slurm"), ("local-login1-0a1b2c3d", "local")):
        path = paths.cluster("c").record
        path.write_text(
            json.dumps(
                {
                    "name": "c",
                    "state": "READY",
                    "slurm_job_id": old,
                    "next_job_id": "12346",
                    "ending": "walltime warning",
                    "allocations": [{"job_id": old, "index": 1, "started": 5.0, "gpu_hours": 2}],
                }
            )
        )
        record = clusters.read("c")
        assert (record.schema_version, record.backend, record.allocation_id) == (2, backend, old)
        assert record.next_allocation_id == "12346" and record.allocations[0].alloc_id == old
        assert record.ending is clusters.EndKind.WALLTIME  # schema 1 said "walltime warning"
        assert record.allocations[0].started == 5.0 and record.allocations[0].gpu_hours == 2  # type: ignore[attr-defined]
        clusters.write(record)
        written = json.loads(path.read_text())
        assert "slurm_job_id" not in written and written["allocation_id"] == old
        assert written["schema_version"] == 2 and written["allocations"][0]["alloc_id"] == old


def test_a_sweep_is_queued_in_one_transaction_with_its_places(home: Path) -> None:
    first = submit("before")
    requests = [
        (JobRequest(id=f"sw-abc123-{k}", name="sw", cluster="c", entrypoint="true", sweep="sw-abc123"), None)
        for k in range(3)
    ]
    queued = queue.enqueue_all(requests)
    assert [(q.record.id, q.place) for q in queued] == [
        ("sw-abc123-0", 2),
        ("sw-abc123-1", 3),
        ("sw-abc123-2", 4),
    ]
    assert [e.job_id for e in queue.waiting("c")] == [first, *(q.record.id for q in queued)]
    assert {q.note for q in queued} == {None}  # (nothing ending: nothing to be told)
    clusters.update("c", ending=clusters.EndKind.WALLTIME, allocation_id="77", next_allocation_id="78")
    ending = queue.enqueue_all([(JobRequest(id="w-1", name="w", cluster="c", entrypoint="true"), None)])
    assert ending[0].note == (
        "allocation 77 is ending (walltime): nothing more starts in it; "
        "queued jobs start in the next one (78, pending)"
    )
    clusters.update("c", state=ClusterState.STOPPING)
    more = [(JobRequest(id=f"late-{k}", name="late", cluster="c", entrypoint="true"), None) for k in range(2)]
    with pytest.raises(ClusterError, match="cluster c is STOPPING"):
        queue.enqueue_all(more)
    assert len(queue.waiting("c")) == 5


def test_a_sweep_the_filesystem_refuses_midway_is_queued_not_at_all(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full quota at the third job of a sweep: the two before it are taken back (a partial sweep
    would be run, then submitted again by the user); what was queued before stays."""
    first = submit("before")
    real, calls = queue.create_job, []

    def full_at_third(cluster: str, record: object) -> bool:
        calls.append(cluster)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", "/x/jobs/sw-3.json")
        return real(cluster, record)

    monkeypatch.setattr(queue, "create_job", full_at_third)
    requests = [
        (JobRequest(id=f"sw-abc123-{k}", name="sw", cluster="c", entrypoint="true", sweep="sw-abc123"), None)
        for k in range(1, 5)
    ]
    with pytest.raises(OSError, match="No space left"):
        queue.enqueue_all(requests)
    assert [e.job_id for e in queue.waiting("c")] == [first]
    assert [r.id for r in all_jobs("c")] == [first]
    lines = paths.cluster("c").journal.read_text().split()
    assert lines.count("+") == 3 and lines.count("-") == 2  # (the two taken back, said so)
    # The entry write itself refused (the ledger was made): the job is taken back too.
    monkeypatch.setattr(queue, "create_job", real)
    monkeypatch.setattr(
        queue, "touch", lambda path: (_ for _ in ()).throw(OSError(errno.EDQUOT, "Disk quota exceeded"))
    )
    with pytest.raises(OSError, match="Disk quota exceeded"):
        queue.enqueue_all(requests[:1])
    assert [r.id for r in all_jobs("c")] == [first]


def test_a_write_the_disk_refuses_names_its_file(tmp_path: Path) -> None:
    """write() on a full disk raises ENOSPC without a file name: the one-line error must say
    which filesystem is full (`raystack submit` said `internal error: OSError` instead)."""
    from raystack.client.cluster import filesystem_error

    with pytest.raises(OSError) as caught:
        files.append_line(Path("/dev/full"), "x")  # (every write: ENOSPC)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/dev/full"
    said = filesystem_error(caught.value)
    assert said is not None and said.startswith(
        "/dev/full: No space left on device: RAYSTACK_HOME's filesystem ("
    )
    assert "is full or over your quota; free room there (`raystack forget`" in said


def test_the_bounded_queue_names_only_what_it_leaves_out(home: Path) -> None:
    """493426b: `raystack queue` under a sweep printed '... and 0 more queued, 8 more finished'."""
    for i in range(22):
        submit(f"j{i}")
    result = CliRunner().invoke(app, ["queue", "-c", "c"])
    assert result.exit_code == 0, result.output
    assert "... and 2 more queued: raystack queue c --all" in result.output
    assert "more finished" not in result.output
    assert queue.QueueView([], {}, 0, 3).hidden() == "3 more finished"
    assert queue.QueueView([], {}).hidden() == ""


def test_a_sweeps_line_counts_all_its_jobs_not_those_shown(home: Path) -> None:
    """493426b: with its finished jobs beyond the bounded view, a sweep of 16 read
    'sweep acc-e65b0f: 5 succeeded, 4 cancelled' (12 had succeeded)."""
    for k in (1, 2, 3):
        request = JobRequest(id=f"s-{k}", name="s", cluster="c", entrypoint="true", sweep="s")
        queue.enqueue(request)
    update_job("c", "s-1", state=JobState.SUCCEEDED)
    result = CliRunner().invoke(app, ["queue", "-c", "c", "--state", "QUEUED"])
    assert result.exit_code == 0, result.output
    assert "sweep s: 1 succeeded, 2 queued" in result.output


def test_the_bounded_view_counts_a_sweep_from_the_listings_not_every_ledger(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in (1, 2, 3):
        queue.enqueue(JobRequest(id=f"s-{k}", name="s", cluster="c", entrypoint="true", sweep="s"))
    other = submit("j")
    queue.cancel("c", "s-1")
    queue.cancel("c", other)
    read: list[str] = []
    real = queue.read_job
    monkeypatch.setattr(queue, "read_job", lambda name, job_id: read.append(job_id) or real(name, job_id))
    view = queue.view("c", head=1, recent=1)
    assert [r.id for r in view.records] == ["s-2", other]  # s-1 and s-3 not shown ...
    assert view.sweeps == {"s": {"CANCELLED": 1, "QUEUED": 2}}  # ... but counted
    assert sorted(read) == sorted(["s-2", other])  # without reading their ledgers


def test_a_name_being_submitted_is_claimed_once_and_an_interrupted_submit_frees_it(home: Path) -> None:
    # Two `raystack up --name x` at once: the second finds the first's claim (SUBMITTED, no
    # allocation id yet, by a live process) under the folder lock and submits nothing.
    first = claims.begin("x", nodes_expected=1)
    assert first.submitter == clusters.submitter() and claims.submitting(first)
    with pytest.raises(ClusterError, match=r"name 'x' is being submitted by another `raystack up`"):
        claims.begin("x", nodes_expected=2)
    assert clusters.read("x").nodes_expected == 1
    # Its allocation recorded: a live cluster, refused as such.
    clusters.update("x", allocation_id="41")
    with pytest.raises(ClusterError, match=r"in use by a live cluster \(allocation 41, SUBMITTED\)"):
        claims.begin("x", nodes_expected=2)
    # An `up` interrupted in sbatch (its process gone, no allocation id): the name is free again.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    clusters.update(
        "x", allocation_id=None, submitter=f"{clusters.submitter().rpartition(':')[0]}:{dead.stdout.strip()}"
    )
    assert not claims.submitting(clusters.read("x"))
    assert claims.begin("x", nodes_expected=3).nodes_expected == 3
    # From another host, a claim holds for SUBMIT_STALE seconds.
    other = clusters.read("x").model_copy(update={"submitter": "login9:1"})
    assert claims.submitting(other, now=other.updated + 1)
    assert not claims.submitting(other, now=other.updated + claims.SUBMIT_STALE)
    assert claims.in_use(other.model_copy(update={"state": ClusterState.STOPPED})) is None


def test_an_up_writes_its_allocation_only_into_its_own_claim(home: Path) -> None:
    claims.begin("y", nodes_expected=1)
    assert claims.update_claim("y", allocation_id="7") is not None  # (its own claim)
    assert claims.update_claim("y", allocation_id="8") is None  # (it has one already)
    claims.begin("z", nodes_expected=1)
    clusters.update("z", state=ClusterState.STOPPED)  # (`raystack down` while sbatch ran)
    assert claims.update_claim("z", allocation_id="9") is None
    clusters.update("z", state=ClusterState.SUBMITTED, submitter="login9:1")  # (begun by another up)
    assert claims.update_claim("z", allocation_id="9") is None
    assert clusters.read("z").allocation_id is None
    assert claims.update_claim("gone", allocation_id="10") is None  # (forgotten meanwhile)


def test_how_messages_name_a_cluster_is_never_written(home: Path) -> None:
    """`described` names the cluster a profile would make (`raystack check -P`): it is no record."""
    record = ClusterRecord(name="c", described="the cluster of profile testbed")
    assert record.title == "the cluster of profile testbed" and ClusterRecord(name="c").title == "cluster 'c'"
    assert "described" not in record.model_dump() and "described" not in record.model_dump_json()


def test_every_file_of_the_cluster_folder_is_the_users_only(home: Path) -> None:
    """With a login shell's umask (022) a submit and a local allocation's start leave nothing
    0644 in the 0700 cluster folder: the lock, the queue's journal, a node log are 0600."""
    from raystack.adapters import local

    old = os.umask(0o022)
    try:
        submit()
        log = paths.cluster("c").logs / "node-test.log"
        local.start("local-test", Path("/nonexistent/script"), log)
    finally:
        os.umask(old)
    root = paths.cluster("c").root
    made = [p for p in root.rglob("*") if p.is_file()]
    loose = [
        f"{p.relative_to(root)} {oct(p.stat().st_mode & 0o777)}" for p in made if p.stat().st_mode & 0o077
    ]
    assert {".lock", "queue/journal", "logs/node-test.log"} <= {str(p.relative_to(root)) for p in made}
    assert loose == [], loose


RACER = """
import sys, time
from pathlib import Path
from raystack.store import queue
from raystack.store.ledger import JobRequest
folder, i = Path(sys.argv[1]), sys.argv[2]
(folder / f"ready-{i}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
request = JobRequest(id=f"race-{i}", name="race", cluster="c", entrypoint="true")
print(queue.enqueue_all([(request, None)])[0].place)
"""


def test_racing_submits_are_each_told_a_place_of_their_own(home: Path) -> None:
    """A new user's racing submits (20 at once) reported two jobs at the same queue position. With
    no job started between them (nothing runs here), 16 processes submitting at once are told
    1..16, each once: the place is read in the same transaction, under the lock, as the queueing.
    (Where the runner starts a job between two submits, both may be told "position 2": each was
    right when it was told.) Fresh processes, released together: a forked pool once left a worker
    waiting on its queue's lock for ever, and pytest waited for it at exit."""
    folder = home / "race"
    folder.mkdir()
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(folder), str(i)], stdout=subprocess.PIPE, text=True
        )
        for i in range(16)
    ]
    try:
        wait_until(lambda: len(list(folder.glob("ready-*"))) == 16, 60, "the racers to be ready")
        (folder / "go").touch()
        places = [int(r.communicate(timeout=60)[0]) for r in racers]
    finally:
        for r in racers:
            r.kill()
    assert sorted(places) == list(range(1, 17)), places
    assert len(queue.waiting("c")) == 16


def test_a_submit_wakes_the_runner_listening_on_this_machine(home: Path) -> None:
    """enqueue writes a byte down the pipe the record names (the runner's, allocation/runner/endwatch.py
    listen): its pause ends at once; a record naming no pipe, or one nobody reads, still queues."""
    from raystack.allocation.runner.endwatch import EndWatch

    submit("before")  # (no runner_wake in the record: queued, nothing to wake)
    ends = EndWatch(root=os.getpid())
    pipe = str(home / "runner.wake")
    assert ends.listen(pipe)
    clusters.update("c", runner_wake=pipe)
    t0 = time.monotonic()
    submit("woken")
    ends.pause(5.0)
    assert time.monotonic() - t0 < 2.0
    clusters.update("c", runner_wake=str(home / "gone.wake"))
    submit("after")
    assert len(queue.waiting("c")) == 3
