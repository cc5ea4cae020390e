"""The persistent queue in the cluster folder, and its transactions.

    queue/<seq>-<id>   one empty file per job not yet started; the names order the queue
                       (<seq> = 0 + time for --now jobs, 1 + time for the rest)
    queue/journal      "+ <entry>" / "- <entry>" per change, appended: the runner reads only what
                       changed since its last pass, and on NFS opening a file revalidates it
                       where a directory listing may be cached for up to a minute
    active/<id>        one empty file per job given to Ray and not yet finished

Every change is one transaction under the cluster lock, so `cancel` and the runner's `start`
cannot both win. Each transaction creates the new state before it removes the old one, so a
process killed in between leaves a job in two places (which the next transaction resolves),
never in none; `recover` puts back on the queue what an older version could strand.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from raystack.errors import ClusterError, ConfigError
from raystack.store import cluster as records
from raystack.store import deps, paths
from raystack.store.files import append_line, locked, make_private_dirs, poke, quarantine, touch
from raystack.store.ledger import (
    Attempt,
    JobRecord,
    JobRequest,
    JobState,
    Unreadable,
    all_jobs,
    change_job,
    create_job,
    finished_states,
    read_job,
    recently_finished,
    set_aside,
)
from raystack.waiting import retry

log = logging.getLogger("raystack")
ID_RETRIES = 5
SECOND_READ = 0.2  # seconds before a writer reads an unreadable ledger again (then sets it aside)


@dataclass(frozen=True, order=True)
class Entry:
    """One queue file: its name orders the queue."""

    seq: str
    job_id: str

    @property
    def name(self) -> str:
        return f"{self.seq}-{self.job_id}"

    @property
    def now(self) -> bool:
        return self.seq.startswith("0")

    @classmethod
    def parse(cls, name: str) -> Entry | None:
        seq, sep, job_id = name.partition("-")
        if not sep or len(seq) != 21 or not seq.isdigit() or not paths.NAME.fullmatch(job_id or "-"):
            return None
        return cls(seq, job_id)


def waiting(name: str) -> list[Entry]:
    """The queue in order (one directory listing, no ledger read); a file whose name is not a
    queue entry is left alone (and not counted)."""
    p = paths.cluster(name)
    entries = []
    for child in os.scandir(p.queue) if p.queue.is_dir() else []:
        if child.name == "journal" or child.name.startswith("."):
            continue
        entry = Entry.parse(child.name)
        if entry is not None:
            entries.append(entry)
    return sorted(entries)


def active(name: str) -> list[str]:
    """Ids of jobs given to Ray and not yet finished."""
    folder = paths.cluster(name).active
    return sorted(e.name for e in os.scandir(folder)) if folder.is_dir() else []


def interrupted(name: str, look: int = 50) -> list[str]:
    """Jobs waiting to resume after an interruption. They keep their original place, ahead of
    every job queued after them, so only the head of the queue is read."""
    found = []
    for entry in waiting(name)[:look]:
        try:
            if read_job(name, entry.job_id).state is JobState.INTERRUPTED:
                found.append(entry.job_id)
        except ClusterError:
            continue
    return found


def positions(name: str) -> dict[str, int]:
    """1-based place of every job not yet started, in queue order."""
    return {e.job_id: i for i, e in enumerate(waiting(name), start=1)}


def position(name: str, job_id: str) -> int:
    """1-based place among jobs not yet started (0 once started or finished)."""
    return positions(name).get(job_id, 0)


# ---------------------------------------------------------------------------- transactions
class Queued(NamedTuple):
    record: JobRecord
    place: int  # 1-based place among the jobs not yet started, as the queue stood then
    note: str | None = None  # what becomes of it in an allocation that is ending (`ending_note`)


def enqueue_all(
    items: Sequence[tuple[JobRequest, JobRequest | None]],
    now: bool = False,
    new_id: object = None,
) -> list[Queued]:
    """Queue jobs (one, or a sweep's: each request with its resume request or None) in one
    transaction under the cluster lock (one lock, one open-check and one listing of the queue for
    a whole sweep); each comes back with its place in the queue.

    Each ledger is created with O_EXCL: an id that exists already (ids are random) gets a new
    one from `new_id` (a callable), so no job ever inherits another's record.
    """
    name = items[0][0].cluster
    p = paths.cluster(name)
    make_private_dirs(p)
    with locked(p):
        cluster = records.check_open(name)
        note = records.ending_note(cluster) if cluster else None
        made: list[JobRecord] = []
        try:
            for request, resume in items:
                made.append(_create(p, request, resume, now, new_id))
        except BaseException:  # (a full filesystem at the third job of a sweep): all or nothing
            for record in made:
                _uncreate(p, record)
            raise
        places = positions(name)
    if cluster and cluster.runner_wake:  # (the runner on this machine takes it at once)
        poke(cluster.runner_wake, b"+")
    return [Queued(record, places.get(record.id, 0), note) for record in made]


def _uncreate(p: paths.ClusterPaths, record: JobRecord) -> None:
    """Take back a job this transaction queued (under its lock: nothing has started it). Removing
    frees room, so it works on a full filesystem; the journal's '-' is best effort (the runner
    drops an entry whose file is gone)."""
    if record.entry:
        (p.queue / record.entry).unlink(missing_ok=True)
    p.ledger(record.id).unlink(missing_ok=True)
    if record.entry:
        with contextlib.suppress(OSError):
            append_line(p.journal, f"- {record.entry}")


def enqueue(
    request: JobRequest,
    now: bool = False,
    new_id: object = None,
    resume_request: JobRequest | None = None,
) -> JobRecord:
    """Write the ledger entry (QUEUED) and the queue file in one transaction."""
    return enqueue_all([(request, resume_request)], now, new_id)[0].record


def _create(
    p: paths.ClusterPaths, request: JobRequest, resume: JobRequest | None, now: bool, new_id: object
) -> JobRecord:
    seq = f"{0 if now else 1}{time.time_ns():020d}"
    for _ in range(ID_RETRIES):
        entry = Entry(seq, request.id)
        record = JobRecord(
            id=request.id,
            name=request.name,
            request=request,
            now=now,
            entry=entry.name,
            resume_request=resume.model_copy(update={"id": request.id}) if resume else None,
            history=[{"state": "QUEUED", "time": time.time(), "message": ""}],
        )
        if create_job(request.cluster, record):
            break
        if not callable(new_id):  # (a chosen id, --submission-id: as the client's own check says it)
            raise ConfigError(id_taken(request.id, request.cluster))
        request.id = new_id(request.name)
    else:
        raise ClusterError(f"no free job id after {ID_RETRIES} tries in {p.jobs}")
    try:
        touch(p.queue / entry.name)
        append_line(p.journal, f"+ {entry.name}")
    except BaseException:
        _uncreate(p, record)
        raise
    return record


def cancel(name: str, job_id: str, message: str = "cancelled before it started") -> JobRecord:
    """Remove a job that has not started from the queue: CANCELLED (one transaction)."""
    p = paths.cluster(name)
    with locked(p):
        record = read_job(name, job_id)
        waiting_now = record.state is JobState.INTERRUPTED or (
            record.state is JobState.QUEUED and not record.attempts
        )
        if record.state.is_terminal():
            raise ClusterError(f"job {job_id} has ended ({record.state.value}): nothing to cancel")
        if not waiting_now or (p.active / job_id).exists():
            raise ClusterError(
                f"job {job_id} is {record.state.value}, not queued: "
                f"`raystack stop {job_id}` stops a running job"
            )
        record = change_job(name, job_id, state=JobState.CANCELLED, message=message, ended=time.time())
        if record.entry is not None:  # (after the ledger says CANCELLED: `start` drops a leftover)
            (p.queue / record.entry).unlink(missing_ok=True)
            append_line(p.journal, f"- {record.entry}")
        return record


def start(
    name: str, entry: Entry, allocation: str | None, nodes: tuple[list[str], list[str]] | None = None
) -> JobRecord | None:
    """Take a job off the queue and record its next attempt (one transaction): the submission id
    is the job id, or <id>-r<n> for the n-th time it resumes after an interruption.

    Returns None when the job is not to be started now (cancelled, already started, its ledger
    unreadable twice, or in a state this version does not know, which it leaves alone).
    NOTE: the submission id is recorded before the job is submitted: a runner killed in
    between finds it on restart and asks Ray, instead of submitting the job a second time.
    The active marker and the attempt are written before the queue file goes: a runner killed
    in between leaves the job in both places, and the next `start` only removes the queue file.
    """
    p = paths.cluster(name)
    with locked(p):
        queued = p.queue / entry.name
        if not queued.exists():
            return None  # cancelled meanwhile
        record = read_for_writer(p, name, entry.job_id)
        if record is None:
            _dequeue(p, entry)  # (set aside: nothing can start it)
            return None
        if record.state not in (JobState.QUEUED, JobState.INTERRUPTED):
            if record.state.known:  # cancelled, or ended: a leftover queue file
                _dequeue(p, entry)
            else:
                log.warning(
                    "job %s is %s (another raystack version?): left in the queue", record.id, record.state
                )
            return None
        sid = f"{record.id}-r{record.interruptions}" if record.interruptions else record.id
        started = bool(record.attempts) and record.attempts[-1].id == sid
        if started and (p.active / entry.job_id).exists():
            _dequeue(p, entry)  # started by a runner killed before it removed the queue file
            return None
        # (an active marker without this attempt: a start or requeue cut short; this start redoes it)
        touch(p.active / entry.job_id)
        attempt = Attempt(id=sid, allocation=allocation)
        if nodes is not None:  # (a packed job: its nodes' addresses and Ray node ids)
            attempt.nodes, attempt.node_ids = list(nodes[0]), list(nodes[1])
        changed = change_job(name, entry.job_id, attempts=[*record.attempts, attempt])
        written = read_job(name, entry.job_id)  # (re-check: a filesystem that lost the write)
        if not written.attempts or written.attempts[-1].id != sid:
            (p.active / entry.job_id).unlink(missing_ok=True)
            raise ClusterError(
                f"job {entry.job_id}: its attempt {sid} did not reach {p.ledger(entry.job_id)}"
            )
        _dequeue(p, entry)
        return changed


def _dequeue(p: paths.ClusterPaths, entry: Entry) -> None:
    (p.queue / entry.name).unlink(missing_ok=True)
    append_line(p.journal, f"- {entry.name}")


def read_for_writer(p: paths.ClusterPaths, name: str, job_id: str) -> JobRecord | None:
    """A writer (holding the lock) reads a ledger; one it cannot read twice, SECOND_READ apart,
    is set aside into corrupt/ (the only place anything is ever moved) and None returned."""

    def read(attempt: int) -> tuple[JobRecord | None] | None:
        try:
            return (read_job(name, job_id),)
        except Unreadable as exc:
            if not attempt:
                return None  # (read again, SECOND_READ later)
            moved = quarantine(p, p.ledger(job_id), str(exc))
            log.error("job %s: its ledger could not be read twice; set aside as %s", job_id, moved)
        except ClusterError as exc:
            log.warning("%s; dropping queue entry", exc)
        return (None,)

    got = retry(read, 2, SECOND_READ)
    return got[0] if got else None


def add_attempt(name: str, job_id: str, submission_id: str, allocation: str | None) -> JobRecord:
    """Record a further attempt of an active job (a retry, or a submission id taken by another)."""
    with locked(paths.cluster(name)):
        record = read_job(name, job_id)
        attempt = Attempt(id=submission_id, allocation=allocation)
        return change_job(name, job_id, attempts=[*record.attempts, attempt])


def finish(name: str, job_id: str, **changes: Any) -> JobRecord:
    """Record a job's final state and take it off the active list (one transaction)."""
    p = paths.cluster(name)
    with locked(p):
        record = change_job(name, job_id, **changes)
        (p.active / job_id).unlink(missing_ok=True)
        return record


def id_taken(job_id: str, cluster: str) -> str:
    """What a submit with a chosen id that a job of the cluster has already is told (checked
    before anything is written, and again under the lock: a racing submit gets the same line)."""
    return f"--submission-id {job_id}: cluster {cluster} has a job {job_id}; choose another"


# ---------------------------------------------------------------------------- the journal
class JournalReader:
    """Follows queue/journal from an offset: each call returns only the lines added since."""

    def __init__(self, name: str):
        self.path = paths.cluster(name).journal
        self.offset = self.path.stat().st_size if self.path.exists() else 0
        self.partial = b""

    def changes(self) -> list[tuple[str, str]]:
        """[('+' | '-', entry name), ...] appended since the last call."""
        try:
            with open(self.path, "rb") as fh:  # NOTE: open() revalidates the file on NFS
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:  # truncated or replaced: start over
                    self.offset, self.partial = 0, b""
                if size == self.offset:
                    return []
                fh.seek(self.offset)
                data = self.partial + fh.read(size - self.offset)
                self.offset = size
        except FileNotFoundError:
            return []
        *lines, self.partial = data.split(b"\n")
        out = []
        for line in lines:
            op, _, entry = line.decode(errors="replace").partition(" ")
            if op in ("+", "-") and entry:
                out.append((op, entry))
        return out


# ---------------------------------------------------------------------------- listing
@dataclass
class QueueView:
    """What `raystack queue` shows: jobs in flight, the head of the queue, the last finished."""

    records: list[JobRecord]
    positions: dict[str, int]
    more_queued: int = 0
    more_finished: int = 0
    set_aside: dict[str, Path] = field(default_factory=dict)  # unreadable ledgers moved to corrupt/
    sweeps: dict[str, dict[str, int]] = field(default_factory=dict)  # per sweep shown: all its jobs

    def hidden(self) -> str:
        """What the bounded view leaves out, in words ('' when nothing): '3 more queued, ...'."""
        parts = [(self.more_queued, "queued"), (self.more_finished, "finished")]
        return ", ".join(f"{n} more {what}" for n, what in parts if n)


def view(name: str, every: bool = False, head: int = 20, recent: int = 10) -> QueueView:
    """The queue as a user sees it. Bounded by default (cost independent of the queue's length
    beyond one directory listing); `every` reads the whole ledger, oldest first."""
    order = waiting(name)
    places = {e.job_id: i for i, e in enumerate(order, start=1)}
    if every:
        every_job = all_jobs(name)
        return QueueView(every_job, places, set_aside=set_aside(name), sweeps=sweep_counts(name, every_job))
    finished = recently_finished(name, recent)
    wanted = [*finished, *active(name), *(e.job_id for e in order[:head])]
    records = []
    for job_id in dict.fromkeys(wanted):
        try:
            records.append(read_job(name, job_id))
        except ClusterError as exc:
            log.warning("%s", exc)
    records.sort(key=lambda r: r.request.queued_at)
    total_finished = count_lines(paths.cluster(name).finished)
    return QueueView(
        records,
        places,
        max(0, len(order) - head),
        max(0, total_finished - len(finished)),
        set_aside(name),
        sweep_counts(name, records, order),
    )


def sweep_counts(
    name: str, shown: list[JobRecord], order: Sequence[Entry] | None = None
) -> dict[str, dict[str, int]]:
    """Per sweep of a job in `shown`, how many of all its jobs (<sweep>-<k>) are in each state,
    in the order of k: from the records shown, then the queue's listing `order` (QUEUED) and the
    finished index (its last state per job) for the others, so a bounded view reads no more
    ledgers for it. Without `order`, `shown` holds every job."""
    sweeps = {r.request.sweep for r in shown if r.request.sweep}
    if not sweeps:
        return {}
    state: dict[str, str] = {}
    if order is not None:
        state.update(finished_states(name))
        state.update((e.job_id, JobState.QUEUED.value) for e in order)
    state.update((r.id, r.state.value) for r in shown)
    found: dict[str, dict[str, int]] = {}
    for sweep in sorted(sweeps):
        jobs = [i for i in deps.members(sweep, state) if i != sweep]
        counts = found.setdefault(sweep, {})
        for job_id in sorted(jobs, key=lambda i: int(i.rpartition("-")[2])):
            counts[state[job_id]] = counts.get(state[job_id], 0) + 1
    return found


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0
