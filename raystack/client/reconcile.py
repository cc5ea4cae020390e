"""Reconciliation: what a cluster record that looks alive means once SLURM says its allocation
ended, and the one place that writes it down.

The head records the end itself when SLURM signals it; this covers the cases where it could not
(SIGKILL, node failure, cancelled while pending). Readers (`status`, `queue`, `logs`, `list`,
`wait`) only *look*: `pending_end` asks SLURM and `as_ended` shows the record as it will be,
without writing. `settle` writes it (under the folder lock, through walltime.end_allocation); the
commands that change a cluster call it (`up` before reusing a name, `down`, `submit`, `forget`),
and so does the next allocation's head when it claims the cluster. SLURM's answer is trusted only
when it is final (`adapters.allocator.ended`): a failing squeue is never an answer, and "gone"
(slurmctld no longer knows the job and accounting has no row) must be said twice, a second apart.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass

from raystack.adapters import allocator as allocated
from raystack.adapters.allocator import AllocInfo
from raystack.store import claims, paths, raylogs
from raystack.store import cluster as records
from raystack.store.cluster import ClusterRecord, ClusterState, EndKind
from raystack.store.ledger import JobRecord, JobState
from raystack.store.recovery import orphan_outcome, stopped_at
from raystack.walltime import Ending, classify, end_allocation, end_changes

SPOOLED = re.compile(r"^\S*/slurm_script: ")  # SLURM runs a copy of the script from its spool


@dataclass(frozen=True)
class PendingEnd:
    """An allocation that SLURM says ended while the record still shows it alive."""

    alloc_id: str
    end: Ending
    state: ClusterState  # the state the cluster ends in (unless a follow-on takes over)
    at: float | None = None  # when its jobs stopped running, where known (None: now)


def pending_end(record: ClusterRecord, info: AllocInfo | None = None) -> PendingEnd | None:
    """How a live-looking record's allocation ended, when SLURM says it did (nothing is written).
    `info` saves a query when the caller has one."""
    if record.state.is_terminal():
        return None
    if not record.allocation_id:
        return interrupted(record)
    alloc_id = str(record.allocation_id)
    ended = allocated.ended(record.backend, alloc_id, info)
    if ended is None:
        return None
    ran = record.state in (ClusterState.READY, ClusterState.STOPPING)
    if ran or record.state is ClusterState.STARTING:
        # The head could not record the end itself (SIGKILL, a node failure).
        end = classify(record, alloc_id, info=ended)
    else:  # the cluster never started: cancelled or refused while pending, or its script failed
        end = Ending(EndKind.FAILED, never_started(record.name, alloc_id, ended), False, False)
    state = ClusterState.STOPPED if ran and end.kind is not EndKind.FAILED else ClusterState.FAILED
    return PendingEnd(alloc_id, end, state, last_alive(record.name, ended))


def last_alive(name: str, ended: AllocInfo) -> float | None:
    """When an allocation that ended unrecorded last ran its jobs: the head's last heartbeat, or
    the scheduler's end time where that is earlier (None where neither is known)."""
    known = [float(ended.end_time)] if ended.end_time > 0 else []
    with contextlib.suppress(OSError):
        known.append(paths.cluster(name).heartbeat.stat().st_mtime)
    known = [t for t in known if t >= ended.start_time]  # (not a beat of the allocation before)
    return min([*known, time.time()]) if known else None


def interrupted(record: ClusterRecord) -> PendingEnd | None:
    """A record its `raystack up` left SUBMITTED with no allocation id (stopped in sbatch: Ctrl-C
    while slurmctld hangs, a killed shell) ends FAILED once that process is gone, so no job is
    queued for an allocation that never comes and `wait` does not wait for it. None while it
    submits. (PendingEnd's alloc_id is '': there is none.)"""
    if not claims.abandoned(record):
        return None
    text = (
        "its `raystack up` stopped before the allocation's id was recorded (interrupted?); if SLURM "
        f"queued it all the same, `squeue --name raystack-{record.name}` shows it: scancel it"
    )
    return PendingEnd("", Ending(EndKind.FAILED, text, False, False), ClusterState.FAILED)


def never_started(name: str, alloc_id: str, ended: AllocInfo) -> str:
    """Why an allocation ended before its cluster started: SLURM's state and reason, and what the
    script last printed (a site's setup line that failed: `module: command not found`, a venv
    that is not there), which is the first thing a person needs to see."""
    reason = f", {ended.reason}" if ended.reason and ended.reason != "None" else ""
    folder = paths.cluster(name)
    last = raylogs.last_line(folder.allocation_log(alloc_id), limit=300)
    last = SPOOLED.sub(f"{folder.script}: ", last)  # (the line number is the launch script's)
    return f"{ended.state_text}{reason} before the cluster started" + (f": {last}" if last else "")


def as_ended(record: ClusterRecord, pending: PendingEnd | None) -> ClusterRecord:
    """The record as `settle` will write it (a copy; the file is not touched)."""
    if pending is None:
        return record
    if not pending.alloc_id:  # (interrupted before it had one)
        return record.model_copy(update={"state": pending.state, "message": pending.end.text})
    logs = str(paths.cluster(record.name).logs)
    changes, _ = end_changes(record, pending.alloc_id, pending.end, pending.state, logs)
    return record.model_copy(update=changes)


def job_as_ended(job: JobRecord, pending: PendingEnd | None) -> JobRecord:
    """A job in flight in an allocation that ended unrecorded, as `settle` will leave it."""
    if pending is None or job.state.is_terminal() or not job.attempts:
        return job
    if job.attempts[-1].allocation != pending.alloc_id:
        return job
    end = pending.end
    state, message = orphan_outcome(job, end.text, end.requeue, stopped=end.kind is EndKind.DOWN)
    at = stopped_at(job, pending.at) or time.time()
    shown = job.model_copy(update={"history": list(job.history)})  # (the history is appended to)
    ended = None if state is JobState.INTERRUPTED else at
    records.apply_changes(shown, {"state": state, "message": message, "ended": ended, "at": at})
    return shown


def settle(record: ClusterRecord, info: AllocInfo | None = None) -> ClusterRecord:
    """Write down the end of a live-looking record's allocation when SLURM says it ended (its jobs
    in flight settled, a follow-on handed the cluster or cancelled). The record as it now is."""
    pending = pending_end(record, info)
    if pending is None:
        return record
    if not pending.alloc_id:  # (interrupted before it had one: nothing ran, nothing to settle)
        # (unless a new `up` claimed the name meanwhile)
        changes = {"state": pending.state, "message": pending.end.text}
        return claims.update_if(record.name, claims.abandoned, **changes) or records.read(record.name)
    current = records.read(record.name)
    if current.allocation_id != record.allocation_id or current.state.is_terminal():
        return current  # someone settled it, or a new allocation took over, meanwhile
    return end_allocation(record.name, pending.alloc_id, pending.end, pending.state, pending.at)
