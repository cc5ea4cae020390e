"""The client's handle on one queued job: wait, logs, follow, stop, cancel.

job = Cluster.get("demo").submit("jobs/debug/hello.yaml", sets=["env.X=1"])
job.wait(); print(job.logs()); job.record().state
"""

from __future__ import annotations

import codecs
import contextlib
import difflib
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from raystack.client.access import live_dashboard
from raystack.client.reconcile import PendingEnd, as_ended, job_as_ended, pending_end
from raystack.durations import duration_text
from raystack.errors import ClusterError, RaystackError
from raystack.store import cluster as records
from raystack.store import deps, node_entries, paths, raylogs, stacks, workerlogs
from raystack.store.ledger import JobRecord, JobState, read_job, set_aside, update_job
from raystack.store.queue import active, cancel, position
from raystack.waiting import REAL, Clock, Every, until

SAY_AGAIN = 600.0  # seconds after which a follow says the same waiting line again
DURATION = re.compile(r"\b\d+[smhd](?:\d+[smhd])*\b")  # (1m24s: the job ahead's time, always moving)


def without_times(line: str) -> str:
    """A waiting line without its running times: said again only when more than those changed."""
    return DURATION.sub("", line)


def find_cluster_of(job_id: str, cluster: str | None = None) -> str:
    """The cluster holding job `job_id` (searching every cluster when none is named)."""
    names = [records.resolve(cluster)] if cluster else records.list_names()
    if cluster and not records.exists(names[0]):
        records.read(names[0])  # (raises: no cluster named ..., with the known ones)
    for name in names:
        if paths.cluster(name).ledger(job_id).is_file():
            return name
    for name in names:
        if moved := set_aside(name).get(job_id):
            raise ClusterError(
                f"job {job_id} of cluster {name}: its ledger could not be read and was set aside as "
                f"{moved}; raystack no longer runs or follows it (submit it again if it had not ended)"
            )
    ids = {name: deps.job_ids(name) for name in names}
    for name, found in ids.items():
        if members := sorted(deps.members(job_id, found), key=lambda j: int(j.rsplit("-", 1)[1])):
            span = members[0] if len(members) == 1 else f"{members[0]} ... {members[-1]}"
            raise ClusterError(
                f"{job_id} is a sweep of {len(members)} job(s) in cluster {name} ({span}): name one of its "
                f"jobs; `raystack queue --all` lists them, `raystack cancel {job_id}` takes the queued ones"
            )
    if cluster and (elsewhere := deps.holder(job_id, names[0])):
        why = f"no job '{job_id}' in cluster {names[0]}: it is in cluster {elsewhere} (-c {elsewhere})"
        raise ClusterError(why)
    known = {job: name for name, found in ids.items() for job in found}
    searched = f"cluster {cluster}" if cluster else f"any cluster in {paths.clusters_dir()}"
    close = _close_id(job_id, known, len(names))
    raise ClusterError(f"no job '{job_id}' in {searched}{close}: list jobs with `raystack queue`")


def _close_id(job_id: str, known: dict[str, str], clusters: int) -> str:
    """' (did you mean ...?)' for a mistyped job id: the closest of the ledgers' ids (-> cluster);
    for a job's name (ids are <name>-<8 hex>), the ids of that name."""
    named = sorted(j for j in known if j.startswith(f"{job_id}-"))
    if len(named) > 1:
        shown = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
        return f" ({job_id} is a name; its jobs: {shown})"
    close = named or difflib.get_close_matches(job_id, list(known), n=1, cutoff=0.8)
    if not close:
        return ""
    return f" (did you mean {close[0]}" + (f" in cluster {known[close[0]]}" if clusters > 1 else "") + "?)"


FULL = 2**20  # bytes free under which the cluster folder's filesystem is full for a job's log


def full_filesystem(cluster: str) -> str | None:
    """'the filesystem of <cluster folder> is full (N KiB free)' where it is (as statvfs sees it; a
    quota it does not show is the site's `quota` tool's to say); None where there is room."""
    root = paths.cluster(cluster).root
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return None
    return f"the filesystem of {root} is full ({free // 1024} KiB free)" if free < FULL else None


def stale_note(cluster: str) -> str | None:
    """Why the states shown may lag: the queue runner cannot write the ledger on a full filesystem
    (a job that ended shows RUNNING, the next does not start, until there is room)."""
    full = full_filesystem(cluster)
    if full is None:
        return None
    return (
        f"{full}: the queue runner cannot record jobs' ends or start the next until there is room, "
        "so these states may lag (a job that ended can show RUNNING); free room there "
        "(`raystack forget` removes ended clusters' folders)"
    )


@dataclass(eq=False, repr=False)
class Job:
    """A job in a cluster's queue and ledger; everything it knows is on the shared filesystem."""

    cluster: str
    id: str
    seen: JobRecord | None = None  # the ledger entry as it was written or last read here
    queued_place: int | None = None  # its place in the queue as `submit` left it (0: started)
    queued_note: str | None = None  # what `submit` was told of the cluster then (`ending_note`)
    _pending: PendingEnd | None = None  # its allocation's end, where it ended unrecorded
    _look: Every = field(default_factory=lambda: Every(2.0))
    _workers_at: Path | None = None  # where `workers()` gathered them, when this reader did

    def __repr__(self) -> str:
        return f"Job({self.cluster!r}, {self.id!r})"

    @classmethod
    def get(cls, job_id: str, cluster: str | None = None) -> Job:
        return cls(find_cluster_of(job_id, cluster), job_id)

    def record(self) -> JobRecord:
        """The ledger entry, read now; a job in flight in an allocation that ended unrecorded (its
        node program killed) as its settlement will leave it, as `queue` and `status` show it."""
        record = read_job(self.cluster, self.id)
        if not record.state.is_terminal() and record.attempts:  # (as `queue` and `status` do)
            if self._look():  # (asking whether the allocation ended may ask SLURM: every 2 s at most)
                try:
                    cluster = records.read(self.cluster)
                    self._pending = None if cluster.state.is_terminal() else pending_end(cluster)
                except RaystackError:
                    self._pending = None
            record = job_as_ended(record, self._pending)
        self.seen = record
        return self.seen

    @property
    def state(self) -> JobState:
        return self.record().state

    def position(self) -> int:
        return position(self.cluster, self.id)

    def cluster_ended(self) -> bool:
        """True once the job's cluster has ended (STOPPED/FAILED), reconciled with SLURM."""
        record = records.read(self.cluster)
        return as_ended(record, pending_end(record)).state.is_terminal()

    def wait(self, timeout: float | None = None, poll: float = 0.2, clock: Clock = REAL) -> JobRecord:
        """Until the job is SUCCEEDED, FAILED, STOPPED or CANCELLED.

        Raises ClusterError after `timeout`, or when the cluster ends while the job is queued.
        """
        check = Every(2.0, clock, first=False)  # (whether the cluster ended: it asks SLURM)
        now: list[JobRecord] = []

        def step() -> JobRecord | None:
            record = self.record()
            now[:] = [record]
            if record.state.is_terminal():
                return record
            if check() and self.cluster_ended() and not (record := self.record()).state.is_terminal():
                raise ClusterError(
                    f"cluster {self.cluster} ended; job {self.id} is still "
                    f"{record.state.value} (it runs when the cluster is up again)"
                )
            return None

        def late() -> ClusterError:
            return ClusterError(f"job {self.id} still {now[0].state.value} after {timeout:.0f}s")

        return until(step, poll, clock, timeout, late)

    @property
    def folder(self) -> Path:
        """Its files in the cluster folder: gathered worker logs, stack dumps."""
        return paths.cluster(self.cluster).job_files(self.id)

    @property
    def workers_folder(self) -> Path:
        """Where its workers' logs lie: gathered by the runner when it ended (the cluster
        folder), else gathered by this reader into the user's cache (readers only read the
        cluster folder)."""
        return self._workers_at or self.folder

    def log_files(self, record: JobRecord | None = None) -> list[Path]:
        """The log file of every attempt, in order (one per Ray submission)."""
        record = record or self.record()
        p = paths.cluster(self.cluster)
        return [p.job_log(self.id, n) for n in range(1, max(1, len(record.attempts)) + 1)]

    def logs(self) -> str:
        """The job's log as kept in logs/jobs/ (readable after the cluster is gone); a job that was
        retried shows each attempt under a header."""
        record = self.record()
        files = self.log_files(record)
        parts = []
        for n, path in enumerate(files, start=1):
            text = raylogs.read_copy(path)  # (capped: its start, a line for what was not kept, its end)
            parts.append(_header(n, record) + text if len(files) > 1 else text)
        return "".join(parts)

    def room_note(self) -> str | None:
        """Why the log of a job in flight may have stopped growing: the cluster folder's filesystem
        is full. None where there is room."""
        full = full_filesystem(self.cluster)
        return full and f"{full}: this log stops growing until there is room, and is written in full then"

    def workers(self, node: str | None = None, actor: str | None = None) -> list[workerlogs.WorkerLog]:
        """The job's Ray workers (its actors) with their gathered logs, those that logged an
        error first. Gathered when the job ended; gathered now from the nodes' copies of Ray's
        logs while it runs or when its end could not (works after `down` either way).
        `node`: a host name; `actor`: part of the actor's (class) name."""
        record = self.record()
        found = workerlogs.read_index(self.cluster, self.id) if record.state.is_terminal() else None
        if found is None and record.attempts:  # (in flight, or its end could not gather them)
            self._workers_at = paths.cache() / "logs" / self.cluster / self.id
            found = workerlogs.gather(self.cluster, record, out_dir=self._workers_at)
        return [
            w
            for w in found or []
            if (node is None or w.host == node) and (actor is None or actor.lower() in w.actor.lower())
        ]

    def worker_tail(self, worker: workerlogs.WorkerLog, lines: int = 40) -> str:
        """The last `lines` lines of a worker's stderr and stdout (Ray's marker lines left out)."""
        folder = self.workers_folder
        parts = []
        for rel in worker.files:
            if rel.endswith(".core.log"):
                continue
            text = (folder / rel).read_text(errors="replace") if (folder / rel).exists() else ""
            kept = [ln for ln in text.splitlines() if not ln.startswith(workerlogs.MARKERS)]
            if kept:
                parts.append(f"--- {rel} ---\n" + "\n".join(kept[-lines:]) + "\n")
        return "".join(parts)

    def stacks(self, timeout: float = 30.0) -> stacks.Dumps:
        """The Python stacks of every process of this running job on every node (py-spy, by each
        node program), into logs/jobs/<id>/stacks/, with its ranks' flight recorders; the job goes
        on. Waits up to `timeout` s for every node of the allocation to answer. Of an ended job:
        the dumps kept from before it was stopped (a hung job's)."""
        record = self.record()
        if record.state not in (JobState.RUNNING, JobState.SUBMITTED):
            found = stacks.kept(self.cluster, self.id)
            if found.files or found.summary:  # (a hung job's, taken before it was stopped)
                return found
            raise ClusterError(
                f"job {self.id} is {record.state.value}: stacks are taken of a running job, "
                "and none were taken of it before it ended"
            )
        cluster = records.read(self.cluster)
        entries = node_entries.read_node_entries(self.cluster)
        hosts = sorted(h for h, e in entries.items() if e.get("alloc_id") == cluster.allocation_id)
        asked = stacks.request(self.cluster, self.id)
        return stacks.wait(self.cluster, self.id, asked, hosts, timeout)

    def waiting_line(self, record: JobRecord | None = None) -> str | None:
        """What a job that has not started waits for, in one line (`queued, position 3 (running:
        grpo-7b, 40m in)`); None once it was handed to Ray."""
        record = record or self.record()
        if record.state not in (JobState.QUEUED, JobState.INTERRUPTED):
            return None
        running = active(self.cluster)
        if self.id in running and self._pending is not None:  # (its allocation ended unrecorded)
            return f"{record.state.value.lower()}, back at the head of the queue when the cluster is up again"
        if self.id in running:  # (taken from the queue, not yet handed to Ray)
            return f"{record.state.value.lower()}, starting now"
        pos = position(self.cluster, self.id)
        why = []
        for job_id in running[:1]:
            with contextlib.suppress(ClusterError):
                ahead = read_job(self.cluster, job_id)
                since = f", {duration_text(time.time() - ahead.started)} in" if ahead.started else ""
                why.append(f"running: {ahead.name}{since}")
        cluster = records.read(self.cluster)
        if cluster.state is not records.ClusterState.READY:
            why.append(f"cluster {cluster.state.value}: raystack status {self.cluster}")
        if note := records.ending_note(cluster):
            why.append(note)
        if record.message:
            why.append(record.message)
        place = "next" if pos == 1 else f"position {pos}" if pos else "about to start"
        return f"{record.state.value.lower()}, {place}" + (f" ({'; '.join(why)})" if why else "")

    def follow(
        self,
        out: TextIO | None = None,
        poll: float = 0.25,
        say: Callable[[str], None] | None = None,
        clock: Clock = REAL,
    ) -> JobRecord:
        """Stream the log as it grows until the job ends (or its cluster does); the final record.
        While the job waits in the queue, `say` (stderr by default) is told why, on each change."""
        printer = _Printer(out or sys.stdout)
        say = say or (lambda line: print(f"raystack: job {self.id} {line}", file=sys.stderr, flush=True))
        check = Every(2.0, clock, first=False)  # (whether the cluster ended: it asks SLURM)
        shown, shown_at = "", 0.0  # the last waiting line, and when

        def step() -> JobRecord | None:
            nonlocal shown, shown_at
            record = self.record()
            ended = False
            if not record.state.is_terminal() and check():
                ended = self.cluster_ended()
                line = self.waiting_line(record) if not ended else None
                if line and (
                    without_times(line) != without_times(shown) or clock.now() - shown_at > SAY_AGAIN
                ):
                    shown, shown_at = line, clock.now()
                    say(line)
            elif not shown and (line := self.waiting_line(record)):
                shown, shown_at = line, clock.now()
                say(line)
            grew = printer.show(self.log_files(record), record)
            if not (record.state.is_terminal() or ended):
                return None
            while grew:  # the runner wrote the final lines after the state: print them first
                record = self.record()
                grew = printer.show(self.log_files(record), record)
            printer.end()
            return record

        return until(step, poll, clock)

    def cancel(self) -> JobRecord:
        return cancel(self.cluster, self.id)

    def stop(self, wait: bool = True) -> JobRecord:
        """SIGTERM the job, SIGKILL after its stop_grace (Ray's supervisor does both): STOPPED.

        A job still in the queue is cancelled instead.
        """
        record = self.record()
        if record.state.is_terminal():
            return record
        if record.state is JobState.QUEUED and not record.attempts:
            with contextlib.suppress(ClusterError):  # the runner may have started it meanwhile
                return self.cancel()
        record = update_job(self.cluster, self.id, stop_requested=time.time())
        if record.attempts:  # at once, rather than at the runner's next pass (which acts too)
            with contextlib.suppress(RaystackError, RuntimeError, OSError):
                live_dashboard(records.read(self.cluster)).stop(record.attempts[-1].id)
        if not wait:
            return self.record()
        return self.wait(timeout=record.request.stop_grace + 60)


def _header(n: int, record: JobRecord) -> str:
    sid = record.attempts[n - 1].id if n <= len(record.attempts) else "?"
    return f"--- raystack: attempt {n} ({sid}) ---\n"


class Sweep:
    """The jobs of one sweep (ids <sweep>-<k>) in a cluster's ledger."""

    def __init__(self, cluster: str, sweep_id: str, job_ids: list[str]):
        self.cluster, self.id, self.job_ids = cluster, sweep_id, job_ids

    @classmethod
    def get(cls, sweep_id: str, cluster: str | None = None) -> Sweep | None:
        """The sweep of this id (searching every cluster when none is named), or None."""
        names = [records.resolve(cluster)] if cluster else records.list_names()
        for name in names:
            found = deps.members(sweep_id, deps.job_ids(name))
            if found and found != [sweep_id]:
                return cls(name, sweep_id, found)
        return None

    def cancel(self) -> tuple[list[JobRecord], list[str]]:
        """Cancel every job of the sweep that has not started; (cancelled, the ids left)."""
        done, left = [], []
        for job_id in self.job_ids:
            record = read_job(self.cluster, job_id)
            if record.state.is_terminal():
                continue
            try:
                done.append(cancel(self.cluster, job_id))
            except ClusterError:
                left.append(job_id)
        return done, left

    def stop(self) -> list[JobRecord]:
        """Stop the whole sweep, as scancel does an array job: the jobs not started are cancelled
        first (none of them starts in a place a stopped one frees), then those in flight are
        stopped together (SIGTERM, SIGKILL after their stop_grace). The records of the jobs acted
        on, as they ended."""
        cancelled, running = self.cancel()
        jobs = [Job(self.cluster, job_id) for job_id in running]
        for job in jobs:
            job.stop(wait=False)
        ended = cancelled + [job.wait(timeout=job.record().request.stop_grace + 60) for job in jobs]
        return sorted(ended, key=lambda r: self.job_ids.index(r.id))


class _Printer:
    """A job's log files (one per attempt) written out as they grow: whole characters (one split
    between two reads is decoded whole), a header per attempt where there are several, a line left
    open ended at the end."""

    def __init__(self, out: TextIO):
        self.out = out
        self.shown, self.offset, self.headed = 0, 0, 0  # attempts fully shown, offset in the next
        self.text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.open_line = False

    def show(self, files: list[Path], record: JobRecord) -> bool:
        """Write what is new; whether anything was."""
        grew = False
        while self.shown < len(files):
            if len(files) > 1 and self.headed <= self.shown:
                self.out.write(("\n" if self.open_line else "") + _header(self.shown + 1, record))
                self.headed, self.open_line = self.shown + 1, False
            chunk, after = raylogs.read_from(files[self.shown], self.offset)
            if chunk:
                self.offset, grew = after, True
                written = self.text.decode(chunk)
                self.out.write(written)
                self.open_line = not written.endswith("\n") if written else self.open_line
            if self.shown + 1 >= len(files):
                break
            self.shown, self.offset = self.shown + 1, 0  # a later attempt exists: this one is complete
        self.out.flush()
        return grew

    def end(self) -> None:
        self.out.write(self.text.decode(b"", final=True) + ("\n" if self.open_line else ""))
        self.out.flush()
