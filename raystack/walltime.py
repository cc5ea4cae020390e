"""Walltime: one named cluster, and its queue, across a chain of allocations.

`raystack up --chain K` asks the scheduler to warn the allocation `signal_lead` seconds before its
end (SLURM: `--signal=B:USR1@<lead>`; the batch shell leaves a flag the head acts on). Once an
allocation is READY and allocations remain, the next one is submitted at once, to start once
this one has ended (the Request's `after`: SLURM's `--dependency=afterany:<this job>`), so its
queue wait overlaps this allocation's run. At the
warning the runner stops the jobs in flight (SIGTERM, so they checkpoint) and puts them back at
the head of the queue (INTERRUPTED); the next allocation resumes them, then the rest in order.

How an allocation's end is told apart (`classify`), and what follows:

| ending      | recognised by                                              | chain   | jobs in flight   |
| ----------- | ---------------------------------------------------------- | ------- | ---------------- |
| walltime    | the USR1 warning came, or the end is at the time limit, or | goes on | resume (requeued)|
|             | SLURM's reason is TimeLimit                                |         |                  |
| node lost   | the head saw a node leave Ray (it then ends the allocation | goes on | resume (requeued)|
|             | itself), or SLURM's reason names a node                    |         |                  |
| preempted   | SLURM's reason says Preempt                                | goes on | resume (requeued)|
| down        | `raystack down` wrote it into the record first             | ends    | STOPPED          |
| idle        | the head's idle autostop wrote it into the record first    | ends    | (none: idle)     |
| scancel     | SIGTERM before the time limit, SLURM's reason None (local: | ends    | resume (requeued)|
|             | a signal to the node program, or it was killed)            |         |                  |
| crashed     | the head's node program met an error it cannot go on with, | goes on | resume (requeued)|
|             | or Ray's head exited under the running cluster (its GCS or |         |                  |
|             | raylet killed: the OOM killer, a node fault)               |         |                  |
| head lost   | a worker found the head's node program gone (SIGKILL, OOM) | goes on | resume (requeued)|
| requeued    | SLURM's restart count of the job grew past this run's      | the same| resume (requeued)|
|             | (`scontrol requeue`, a preemption or node failure that     | job runs|                  |
|             | requeues): SLURM starts the same job id again              | again   |                  |
| failed      | Ray or a node failed to start, or why is unknown           | goes on | resume (requeued)|

Every signal to a raystack or Ray process (SIGTERM, SIGINT, SIGHUP, SIGKILL: a shutdown, a plain
`kill`, the OOM killer) leaves the jobs in flight INTERRUPTED at the head of the queue, to resume
when the cluster is up again (`interruptions` + 1, RAYSTACK_RESUME=1); only `raystack down` stops
them (STOPPED), and only a job's own error fails it.

When the chain ends with a follow-on pending, the follow-on is cancelled: nothing stays in SLURM.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from raystack.adapters.allocator import AllocInfo, allocator, asked
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterRecord, ClusterState, EndKind
from raystack.store.files import locked
from raystack.store.recovery import settle_orphans

log = logging.getLogger("raystack.node")
AT_LIMIT = 90.0  # seconds before the walltime end within which a SIGTERM counts as the walltime


@dataclass(frozen=True)
class Ending:
    kind: EndKind
    text: str
    chain_goes_on: bool
    requeue: bool


# What follows each kind of end: (the chain goes on, the jobs in flight are requeued).
ENDINGS = {
    EndKind.WALLTIME: (True, True),
    EndKind.NODE_LOST: (True, True),
    EndKind.PREEMPTED: (True, True),
    EndKind.DOWN: (False, False),
    EndKind.IDLE: (False, False),
    EndKind.CANCELLED: (False, True),
    EndKind.CRASHED: (True, True),
    EndKind.HEAD_LOST: (True, True),
    EndKind.REQUEUED: (True, True),
    EndKind.FAILED: (True, True),
}
# The text of an end the record announced before it came.
ANNOUNCED = {
    EndKind.IDLE: "idle autostop",
    EndKind.DOWN: "raystack down",
    EndKind.WALLTIME: "walltime",
    EndKind.NODE_LOST: "a node was lost",
}


def ending(kind: str, text: str) -> Ending:
    end = EndKind(kind)
    goes_on, requeue = ENDINGS.get(end, (False, False))  # (an end another version named: final)
    return Ending(end, text, goes_on, requeue)


def classify(
    record: ClusterRecord,
    alloc_id: str,
    info: AllocInfo | None = None,
    now: Callable[[], float] = time.time,
) -> Ending:
    """Why allocation `alloc_id` is ending (see the table above). `info`: SLURM's view, asked for
    when needed and not given."""
    if record.ending is EndKind.IDLE:
        return ending(EndKind.IDLE, record.chain_ended or ANNOUNCED[EndKind.IDLE])
    if record.ending is EndKind.DOWN or record.state is ClusterState.STOPPING:  # (down wins)
        return ending(EndKind.DOWN, ANNOUNCED[EndKind.DOWN])
    if record.ending in ANNOUNCED:
        return ending(record.ending, ANNOUNCED[record.ending])
    if record.walltime_end and now() >= record.walltime_end - AT_LIMIT:
        return ending(EndKind.WALLTIME, "walltime")
    backend = allocator(record.backend)
    info = info or backend.info(alloc_id)
    if info is None:
        return ending(EndKind.FAILED, "ended; SLURM did not say why")
    return ending(*backend.why_ended(info))


def submit_follow_on(name: str, alloc_id: str) -> str | None:
    """Submit the chain's next allocation, waiting on this one (afterany), if one remains.

    Returns its job id. A failure is recorded in the cluster's message, not raised: the
    allocation runs on, and the chain ends with it."""
    record = records.read(name)
    if (
        record.chain_index >= record.chain_count
        or record.next_allocation_id
        or record.chain_ended
        or record.allocation_id != alloc_id
        or (request := asked(record)) is None
    ):
        return None
    try:
        nxt = allocator(record.backend).submit(paths.cluster(name).script, replace(request, after=alloc_id))
    except RaystackError as exc:
        log.error("could not submit allocation %d of the chain: %s", record.chain_index + 1, exc)
        records.update(name, message=f"{record.message}; the next allocation could not be submitted: {exc}")
        return None
    record = records.update(name, next_allocation_id=nxt)
    if record.chain_ended or record.state.is_terminal() or record.state is ClusterState.STOPPING:
        allocator(record.backend).cancel(nxt)  # `raystack down` came meanwhile
        return None
    log.info(
        "allocation %d of %d submitted as %s (to start once %s has ended)",
        record.chain_index + 1,
        record.chain_count,
        allocator(record.backend).place(nxt),
        alloc_id,
    )
    return nxt


# What a record waiting for its allocation's next run (a follow-on, or a requeued job run again)
# no longer holds: the ended run's address, its nodes and its end.
WAITING: dict[str, object] = {
    "state": ClusterState.SUBMITTED,
    "ending": None,
    "gcs_address": None,
    "dashboard_url": None,
    "nodes_joined": 0,
    "walltime_end": None,
}


def end_changes(
    record: ClusterRecord, alloc_id: str, end: Ending, last_state: ClusterState, logs: str
) -> tuple[dict[str, object], str | None]:
    """What allocation `alloc_id`'s end changes in the record (pure), and the pending follow-on
    to cancel (None when there is none or the chain goes on with it)."""
    nxt = record.next_allocation_id
    if end.kind is EndKind.REQUEUED:  # (the same allocation waits in SLURM to run again)
        return {
            **WAITING,
            "message": f"allocation {alloc_id} was requeued by SLURM ({end.text}); it starts again when "
            "SLURM runs it, and the jobs in flight resume there",
        }, None
    if nxt and end.chain_goes_on:
        return {
            **WAITING,
            "message": f"allocation {alloc_id} ended ({end.text}); allocation "
            f"{record.chain_index + 1} of {record.chain_count} is SLURM job {nxt}",
            "allocation_id": nxt,
            "allocation_restart": 0,
            "next_allocation_id": None,
            "chain_index": record.chain_index + 1,
        }, None
    why = end.text
    if nxt:
        why = f"{end.text}; the pending allocation {nxt} was cancelled"
    elif record.chain_index < record.chain_count and end.chain_goes_on:
        why = f"{end.text}; no further allocation was submitted"
    return {
        "state": last_state,
        "message": f"allocation {alloc_id} ended ({why}); logs: {logs}",
        "next_allocation_id": None,
        "ending": None,
        "chain_ended": record.chain_ended or why,
    }, nxt


def end_allocation(
    name: str, alloc_id: str, end: Ending, last_state: ClusterState, at: float | None = None
) -> ClusterRecord:
    """Record allocation `alloc_id`'s end: settle its jobs in flight, and either hand the cluster to
    the pending follow-on (SUBMITTED) or end it (`last_state`), cancelling a follow-on that the
    ending does not let run. Safe to call from the head, the runner or a client (first wins).
    `at`: when it ended, where that was before now (found after the fact)."""
    stopped = end.kind is EndKind.DOWN
    for job in settle_orphans(name, None, end.text, requeue=end.requeue, stopped=stopped, at=at):
        log.info("job %s was in flight: %s", job, "INTERRUPTED, to resume" if end.requeue else "FAILED")
    p = paths.cluster(name)
    with locked(p):
        record = records.read(name)
        if record.allocation_id not in (None, alloc_id):
            return record  # a later allocation holds the cluster already
        records.note_allocation(record, alloc_id, ended=at or time.time(), reason=end.text)
        changes, cancel = end_changes(record, alloc_id, end, last_state, str(p.logs))
        records.apply_changes(record, changes)
        records.write(record)
    ended = record.state.is_terminal()
    grown = [g.alloc_id for g in record.grown if ended and not g.released]
    for job in ([cancel] if cancel else []) + grown:  # (grown ones end with the cluster, not a link)
        with contextlib.suppress(RaystackError):
            allocator(record.backend).cancel(job)
    return record
