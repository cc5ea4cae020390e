"""Walltime: one named cluster, and its queue, across a chain of allocations.

`raystack up --chain K` asks SLURM to warn the allocation `signal_lead` seconds before its end
(`--signal=USR1@<lead>`: every task of the node programs' step gets SIGUSR1; the head acts on
it). Once an allocation is READY and allocations remain, the next one is submitted at once with
`--dependency=afterany:<this job>`, so its queue wait overlaps this allocation's run. At the
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
| down        | `raystack down` wrote it into the record first             | ends    | FAILED           |
| idle        | the head's idle autostop wrote it into the record first    | ends    | (none: idle)     |
| scancel     | SIGTERM before the time limit, SLURM's reason None         | ends    | FAILED           |
| crashed     | the head's node program met an error it cannot go on with  | goes on | resume (requeued)|
| head lost   | a worker found the head's node program gone (SIGKILL, OOM) | goes on | resume (requeued)|
| failed      | Ray or a node failed to start, or Ray's head exited        | goes on | FAILED           |

When the chain ends with a follow-on pending, the follow-on is cancelled: nothing stays in SLURM.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from raystack.adapters import slurm
from raystack.adapters.slurm import JobInfo
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.files import locked
from raystack.store.queue import settle_orphans

log = logging.getLogger("raystack.node")
AT_LIMIT = 90.0  # seconds before the walltime end within which a SIGTERM counts as the walltime
WARNING, NODE_LOST, DOWN, IDLE = "walltime warning", "node lost", "raystack down", "idle"


@dataclass(frozen=True)
class Ending:
    kind: str  # walltime, node lost, preempted, down, idle, scancel, crashed, head lost, failed
    text: str
    chain_goes_on: bool
    requeue: bool


ENDINGS = {
    "walltime": (True, True),
    "node lost": (True, True),
    "preempted": (True, True),
    "down": (False, False),
    "idle": (False, False),
    "scancel": (False, False),
    "crashed": (True, True),
    "head lost": (True, True),
    "failed": (True, False),
}


def ending(kind: str, text: str) -> Ending:
    goes_on, requeue = ENDINGS[kind]
    return Ending(kind, text, goes_on, requeue)


def classify(
    record: ClusterRecord,
    job_id: str,
    info: JobInfo | None = None,
    now: Callable[[], float] = time.time,
) -> Ending:
    """Why allocation `job_id` is ending (see the table above). `info`: SLURM's view, asked for
    when needed and not given."""
    if record.ending == IDLE:
        return ending("idle", record.chain_ended or "idle autostop")
    if record.ending == DOWN or record.state is ClusterState.STOPPING:
        return ending("down", "raystack down")
    if record.ending == WARNING:
        return ending("walltime", "walltime")
    if record.ending == NODE_LOST:
        return ending("node lost", "a node was lost")
    if record.walltime_end and now() >= record.walltime_end - AT_LIMIT:
        return ending("walltime", "walltime")
    info = info or slurm.job_info(job_id)
    if info is None:
        return ending("failed", "ended; SLURM did not say why")
    if info.reason == slurm.LOCAL_ENDED:
        return ending("failed", f"{slurm.LOCAL_ENDED} (killed, or the machine restarted)")
    if slurm.local.is_local(job_id):
        return ending("scancel", "the local node program was sent a signal")
    reason = (info.reason or "").lower()
    if "timelimit" in reason or info.state is slurm.SlurmState.TIMEOUT:
        return ending("walltime", "walltime")
    if "node" in reason or info.state is slurm.SlurmState.NODE_FAIL:
        return ending("node lost", f"node failure ({info.reason or info.state.value})")
    if "preempt" in reason or info.state is slurm.SlurmState.PREEMPTED:
        return ending("preempted", "preempted")
    return ending("scancel", "cancelled by scancel or an administrator")


def submit_follow_on(name: str, job_id: str) -> str | None:
    """Submit the chain's next allocation, waiting on this one (afterany), if one remains.

    Returns its job id. A failure is recorded in the cluster's message, not raised: the
    allocation runs on, and the chain ends with it."""
    record = records.read(name)
    if (
        record.chain_index >= record.chain_count
        or record.next_job_id
        or record.chain_ended
        or record.slurm_job_id != job_id
        or not record.sbatch_options
    ):
        return None
    options = [o for o in record.sbatch_options if not o.startswith("--dependency")]
    try:
        nxt = slurm.sbatch([*options, f"--dependency=afterany:{job_id}"], str(paths.cluster(name).script))
    except RaystackError as exc:
        log.error("could not submit allocation %d of the chain: %s", record.chain_index + 1, exc)
        records.update(name, message=f"{record.message}; the next allocation could not be submitted: {exc}")
        return None
    record = records.update(name, next_job_id=nxt)
    if record.chain_ended or record.state.is_terminal() or record.state is ClusterState.STOPPING:
        slurm.scancel(nxt)  # `raystack down` came meanwhile
        return None
    log.info(
        "allocation %d of %d submitted as SLURM job %s (afterany:%s)",
        record.chain_index + 1,
        record.chain_count,
        nxt,
        job_id,
    )
    return nxt


def end_allocation(name: str, job_id: str, end: Ending, last_state: ClusterState) -> ClusterRecord:
    """Record allocation `job_id`'s end: settle its jobs in flight, and either hand the cluster to
    the pending follow-on (SUBMITTED) or end it (`last_state`), cancelling a follow-on that the
    ending does not let run. Safe to call from the head, the runner or a client (first wins)."""
    for job in settle_orphans(name, None, end.text, requeue=end.requeue):
        log.info("job %s was in flight: %s", job, "INTERRUPTED, to resume" if end.requeue else "FAILED")
    cancel = None
    p = paths.cluster(name)
    with locked(p):
        record = records.read(name)
        if record.slurm_job_id not in (None, job_id):
            return record  # a later allocation holds the cluster already
        records.note_allocation(record, job_id, ended=time.time(), reason=end.text)
        nxt = record.next_job_id
        if nxt and end.chain_goes_on:
            records.apply_changes(
                record,
                {
                    "state": ClusterState.SUBMITTED,
                    "message": f"allocation {job_id} ended ({end.text}); allocation {record.chain_index + 1} "
                    f"of {record.chain_count} is SLURM job {nxt}",
                    "slurm_job_id": nxt,
                    "next_job_id": None,
                    "chain_index": record.chain_index + 1,
                    "ending": None,
                    "gcs_address": None,
                    "dashboard_url": None,
                    "nodes_joined": 0,
                    "walltime_end": None,
                },
            )
        else:
            why = end.text
            if nxt:
                cancel, why = nxt, f"{end.text}; the pending allocation {nxt} was cancelled"
            elif record.chain_index < record.chain_count and end.chain_goes_on:
                why = f"{end.text}; no further allocation was submitted"
            records.apply_changes(
                record,
                {
                    "state": last_state,
                    "message": f"allocation {job_id} ended ({why}); logs: {p.logs}",
                    "next_job_id": None,
                    "ending": None,
                    "chain_ended": record.chain_ended or why,
                },
            )
        records.write(record)
    if cancel:
        with contextlib.suppress(RaystackError):
            slurm.scancel(cancel)
    return record
