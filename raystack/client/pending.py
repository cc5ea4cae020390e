"""What is said of an allocation SLURM holds back (PENDING): its reason and, once the scheduler
has made one, its start estimate; and when `wait` says it again. And of one that runs but is not
heard from here (its nodes do not see the cluster folder)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from raystack.adapters.allocator import AllocInfo, AllocState, allocator, asked
from raystack.durations import duration_text
from raystack.errors import SchedulerError
from raystack.store import paths
from raystack.store.cluster import ClusterRecord

UNSEEN_AFTER = 60.0  # seconds a running allocation's output file may take to appear here


def expected_start(start: int | None, now: float, countdown: bool = True) -> str:
    """SLURM's start estimate of a PENDING allocation, said after its reason once the scheduler
    has made one: `, SLURM expects it to start at 14:05, in 2h10m`; '' without one."""
    if not start or start <= now:
        return ""
    same_year = time.localtime(start).tm_year == time.localtime(now).tm_year
    form = "%H:%M" if start - now < 20 * 3600 else "%a %d %b %H:%M" if same_year else "%a %d %b %Y %H:%M"
    when = time.strftime(form, time.localtime(start))
    return f", SLURM expects it to start at {when}" + (
        f", in {duration_text(start - now)}" if countdown else ""
    )


@dataclass
class PendingShown:
    """What `wait` last said of a PENDING allocation: said again when SLURM's reason changes or
    its start estimate moves by ESTIMATE_MOVES (backfill revises it often, by little)."""

    reason: str | None = None
    start: int = -1

    ESTIMATE_MOVES = 600  # seconds

    def moved(self, info: AllocInfo) -> bool:
        if info.reason == self.reason and (
            info.start_time == self.start
            or (
                info.start_time and self.start > 0 and abs(info.start_time - self.start) < self.ESTIMATE_MOVES
            )
        ):
            return False
        self.reason, self.start = info.reason, info.start_time
        return True


def unseen_output(name: str, info: AllocInfo | None, now: float) -> str | None:
    """Why an allocation SLURM has run for UNSEEN_AFTER seconds has not been heard from: its
    output file (sbatch --output, in the cluster folder) is opened by SLURM on the node as the job
    starts, so where this host cannot see it the nodes do not share RAYSTACK_HOME's filesystem
    (/tmp, a node-local disk) and the cluster can never be seen READY from here. None otherwise."""
    if info is None or info.state is not AllocState.RUNNING or not info.start_time:
        return None
    output = paths.cluster(name).allocation_log(info.alloc_id)
    if now - info.start_time < UNSEEN_AFTER or output.exists():
        return None
    return (
        f"SLURM job {info.alloc_id} has run for {duration_text(now - info.start_time)} "
        f"on {info.nodes or '?'}, "
        f"but its output {output} is not here: its nodes do not see RAYSTACK_HOME ({paths.home()}); put it "
        "on a filesystem the compute nodes share (not /tmp or a node-local disk), then `raystack down` "
        "and up again"
    )


def never_starts(record: ClusterRecord, info: AllocInfo | None) -> str | None:
    """Why a PENDING allocation will never start, and the fix: `raystack down`, then up again
    with what the scheduler's reason asks (its adapter knows them); None while it may still start."""
    if info is None or info.state is not AllocState.WAITING:
        return None
    found = allocator(record.backend).never_starts(info)
    if found is None:
        return None
    why, fix = found
    return f"it never starts ({why}): `raystack down {record.name}`, then up with {fix}"


def nodes_out(record: ClusterRecord, info: AllocInfo | None) -> str | None:
    """Which of the partition's nodes are down or drained, when SLURM says only that a PENDING
    allocation waits for some, and how many can run jobs now; None otherwise (or sinfo silent)."""
    if info is None or info.state is not AllocState.WAITING:
        return None
    backend = allocator(record.backend)
    if not backend.waits_for_nodes_out(info):
        return None
    request = asked(record)
    given = [o.partition("=")[2] for o in request.native if o.startswith("--partition=")] if request else []
    partition = request.queue if request and request.queue else given[-1] if given else None
    try:
        found = backend.nodes_out(partition)
    except SchedulerError:
        return None
    if not found or not found[1]:
        return None
    usable, out = found
    listed = ", ".join(f"{node} {why}" for node, why in list(out.items())[:4])
    partition_words = f"partition {partition}" if partition else "the default partition"
    line = (
        f"{partition_words}: {listed}{' ...' if len(out) > 4 else ''}; {usable} of its nodes can run jobs now"
    )
    if 0 < usable < record.nodes_expected:
        return (
            f"{line}, and it asks {record.nodes_expected}: it starts when enough return, or `raystack "
            f"down {record.name}` and up with --nodes {usable}"
        )
    return line


def pending_line(record: ClusterRecord, info: AllocInfo) -> str:
    """What `up` and `wait` say of a PENDING allocation: its reason, SLURM's start estimate, and
    the fix where it never starts, or which nodes it waits for."""
    why = info.reason if info.reason not in ("", "None") else "not scheduled yet"
    when = expected_start(info.start_time, time.time(), countdown=False)
    hint = never_starts(record, info) or nodes_out(record, info)
    hint = f"; {hint}" if hint else ""
    return f"{info.state_text} in SLURM (job {info.alloc_id}, reason: {why}){when}{hint}"
