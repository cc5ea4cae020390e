"""What puts a job back or settles it outside the runner's normal pass: requeue (INTERRUPTED, first
in the queue), an attempt stranded by a runner or command killed mid-transaction put back
(recover), and the attempts of an allocation that ended without a word settled (settle_orphans):
FAILED, or INTERRUPTED to resume."""

from __future__ import annotations

import logging
import time

from raystack.errors import ClusterError
from raystack.store import paths
from raystack.store.files import append_line, locked, touch
from raystack.store.ledger import (
    JobRecord,
    JobState,
    change_job,
    read_job,
    recently_finished,
)
from raystack.store.queue import Entry, active, read_for_writer, waiting

log = logging.getLogger("raystack")


def recover(name: str) -> list[str]:
    """Jobs the ledger says are QUEUED or INTERRUPTED but that are neither in the queue nor active
    (a process killed between two steps of an older version's transaction): back in the queue,
    at their own place. Reads every ledger not yet finished: called once, when a runner starts."""
    p = paths.cluster(name)
    if not p.jobs.is_dir():
        return []
    done = set(recently_finished(name, 1 << 30))
    candidates = [
        f.stem for f in p.jobs.glob("*.json") if f.stem not in done and paths.NAME.fullmatch(f.stem)
    ]
    if not candidates:
        return []
    recovered = []
    with locked(p):
        queued = {e.job_id for e in waiting(name)}
        running = set(active(name))
        for job_id in candidates:
            if job_id in queued or job_id in running:
                continue
            try:
                record = read_job(name, job_id)
            except ClusterError as exc:
                log.warning("%s", exc)
                continue
            if record.state not in (JobState.QUEUED, JobState.INTERRUPTED):
                continue
            entry = record.entry or Entry(f"1{int(record.request.queued_at * 1e9):020d}", job_id).name
            if record.entry != entry:
                change_job(name, job_id, entry=entry)
            touch(p.queue / entry)
            append_line(p.journal, f"+ {entry}")
            recovered.append(job_id)
    return recovered


def requeue(name: str, job_id: str, message: str) -> JobRecord:
    """Put an interrupted job back at the head of the queue: INTERRUPTED, its original queue entry
    (which sorts before every job queued after it), off the active list. One transaction."""
    p = paths.cluster(name)
    with locked(p):
        return _requeue(p, name, job_id, message)


def _requeue(
    p: paths.ClusterPaths, name: str, job_id: str, message: str, at: float | None = None
) -> JobRecord:
    record = read_job(name, job_id)
    entry = record.entry or Entry(f"1{int(record.request.queued_at * 1e9):020d}", job_id).name
    record = change_job(
        name,
        job_id,
        state=JobState.INTERRUPTED,
        message=message,
        entry=entry,
        interruptions=record.interruptions + 1,
        evicted=None,
        at=at,
    )
    touch(p.queue / entry)  # (before the active marker goes: never in neither place)
    append_line(p.journal, f"+ {entry}")
    (p.active / job_id).unlink(missing_ok=True)
    return record


def orphan_outcome(
    record: JobRecord, reason: str, requeue: bool, stopped: bool = False
) -> tuple[JobState, str]:
    """What becomes of a job in flight whose allocation ended (pure): INTERRUPTED to resume in the
    next allocation when the end requeues its jobs, STOPPED when a person ended it (`down`), else
    FAILED; and the message saying so."""
    last = record.attempts[-1].allocation if record.attempts else None
    allocation = f"allocation {last}" if last else "its allocation"
    message = f"{allocation} ended while the job was {record.state.value} ({reason})"
    if requeue:
        return JobState.INTERRUPTED, message + "; it resumes in the next allocation"
    return (JobState.STOPPED if stopped else JobState.FAILED), message


def stopped_at(record: JobRecord, at: float | None) -> float | None:
    """When a job in flight stopped running, given when its allocation was last alive (`at`;
    None: not known better than now): never before the job started."""
    return max(at, record.started or 0.0) if at else None


def settle_orphans(
    name: str,
    allocation: str | None,
    reason: str,
    requeue: bool = False,
    stopped: bool = False,
    at: float | None = None,
) -> list[str]:
    """Active jobs whose last attempt ran in another allocation than `allocation` (None: any) have
    lost their Ray cluster. By default they are FAILED with `reason`, never submitted again by
    accident; with `requeue` (the allocation ended on purpose: walltime, a lost node with the
    chain going on) they go back to the head of the queue, INTERRUPTED, to resume; `stopped`
    (`raystack down` ended it): STOPPED, as `raystack stop` leaves a job. `at`: when they stopped
    running, where that is known better than now (an allocation that ended unrecorded: its last
    heartbeat), so a job's duration is what it ran, not until its end was noticed."""
    p = paths.cluster(name)
    settled = []
    for job_id in active(name):
        with locked(p):
            if not (p.active / job_id).exists():
                continue  # settled meanwhile (by the head, a worker or a client: first wins)
            record = read_for_writer(p, name, job_id)
            if record is None:
                (p.active / job_id).unlink(missing_ok=True)
                continue
            if record.state in (JobState.QUEUED, JobState.INTERRUPTED) and not record.attempts:
                continue  # a start cut short: the queue file is still there, `start` clears it
            last = record.attempts[-1].allocation if record.attempts else None
            if allocation is not None and last == allocation:
                continue
            if not record.state.is_terminal():
                state, message = orphan_outcome(record, reason, requeue, stopped)
                when = stopped_at(record, at)
                if state is JobState.INTERRUPTED:
                    _requeue(p, name, job_id, message, when)
                else:
                    change_job(name, job_id, state=state, ended=when or time.time(), message=message, at=when)
                settled.append(job_id)
            (p.active / job_id).unlink(missing_ok=True)
    return settled
