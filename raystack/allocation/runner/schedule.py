"""Which queued jobs start now, and on which nodes (the queue runner's choice, pure).

A job that declares nothing occupies the whole cluster: it starts only when nothing else runs
and the last job's resources are free (one after another, the queue's oldest promise). A job
that declares what it occupies (`needs: {nodes: 1}`, or `needs: {gpus: 4, cpus: 16}`, rounded
up to whole nodes) starts beside the running ones while enough nodes are free, on nodes of its
own, first fit in queue order. Jobs behind one that waits for room may start ahead of it
(backfill), but at most BACKFILL of them, and none past a waiting whole-cluster job: nothing
waits forever behind smaller jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BACKFILL = 4  # jobs that may start ahead of one waiting for room
LOOKAHEAD = 64  # queued jobs looked at in one pass


@dataclass(frozen=True)
class Want:
    """A queued job that may start as far as its dependencies and walltime go."""

    job_id: str
    nodes: int | None  # None: the whole cluster
    now: bool = False  # --now: started at once, beside anything


@dataclass
class Board:
    """The cluster as the runner sees it: alive nodes (their addresses, in order), the nodes
    each packed job holds (running, or releasing its resources), and whether a whole-cluster
    job runs or releases its own."""

    alive: list[str]
    held: dict[str, list[str]] = field(default_factory=dict)
    whole: bool = False

    def free(self) -> list[str]:
        if self.whole:
            return []
        taken = {ip for ips in self.held.values() for ip in ips}
        return [ip for ip in self.alive if ip not in taken]

    def idle(self) -> bool:
        return not self.whole and not self.held


def choose(wants: list[Want], board: Board, overtaken: dict[str, int]) -> list[tuple[Want, list[str] | None]]:
    """The jobs to start now, in queue order, each with its nodes (None: the whole cluster, or a
    --now job, which is not pinned). `overtaken` counts, per waiting job, the jobs that started
    ahead of it; it is updated here."""
    picked: list[tuple[Want, list[str] | None]] = []
    blocked: list[str] = []
    for want in wants[:LOOKAHEAD]:
        if want.now:
            picked.append((want, None))
            continue
        if want.nodes is None:
            if board.idle() and not blocked and not any(n for _, n in picked):
                picked.append((want, None))
                board.whole = True
            else:
                blocked.append(want.job_id)
                break  # (a whole-cluster job waits for every other: none may pass it)
            continue
        free = board.free()
        if len(free) < want.nodes or any(overtaken.get(b, 0) >= BACKFILL for b in blocked):
            blocked.append(want.job_id)
            continue
        nodes = free[: want.nodes]
        board.held[want.job_id] = nodes
        picked.append((want, nodes))
        for b in blocked:
            overtaken[b] = overtaken.get(b, 0) + 1
    return picked
