"""Which queued jobs the queue runner starts now, and where (the policy is schedule.py's).

It reads each queued job's request once, tells a job's ledger why it waits (its min_time, its
dependencies), cancels one whose dependencies can never be met, and asks Ray for its alive
nodes only when a packed job is in the running. What it starts has its attempt (and, packed,
its nodes) recorded by store.start; the runner submits it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from raystack.adapters.ray import NodeSummary
from raystack.allocation.runner.schedule import LOOKAHEAD, Board, Want, choose
from raystack.errors import ClusterError
from raystack.plan.topology import nodes_wanted
from raystack.store import cluster as records
from raystack.store import deps, node_entries
from raystack.store import queue as store
from raystack.store.cluster import ClusterRecord
from raystack.store.ledger import JobRecord, JobRequest, read_job, update_job
from raystack.store.queue import Entry

log = logging.getLogger("raystack.runner")
NODES_EVERY = 5.0  # seconds between asks for Ray's alive nodes (for packed jobs)
DEPS_EVERY = 1.0  # seconds between looks at a queued job's dependencies


class Picker:
    """The runner's choice of what to start next, with what it remembers between passes."""

    def __init__(
        self, name: str, api: Any, allocation: str | None, cluster: ClusterRecord, clock: Callable[[], float]
    ):
        self.name, self.api, self.allocation, self.cluster, self.clock = name, api, allocation, cluster, clock
        self.requests: dict[str, JobRequest | None] = {}  # of the jobs in the queue (read once)
        self.deferred: dict[str, str] = {}  # why a queued job waits, as last written to its ledger
        self.dep_checked: dict[str, float] = {}
        self.overtaken: dict[str, int] = {}  # per queued job: jobs started ahead of it (backfill)
        self.nodes_seen: tuple[float, list[NodeSummary]] = (-1e9, [])
        self.held_seen: tuple[float, tuple[int, int, int] | None] = (-1e9, None)

    def pick(self, waiting: list[Entry], board: Board) -> list[JobRecord]:
        """Start --now jobs at once, then what fits, in queue order (allocation/runner/schedule.py): a
        job that declares nothing when nothing else runs, a packed job on nodes of its own.

        A job whose `min_time` is more than the allocation has left, or whose dependencies have
        not ended as asked, is passed over (it keeps its place, and says why); the jobs behind
        it may start meanwhile. One whose dependencies can never be met is CANCELLED."""
        wants, by_id, out = [], {}, []
        for entry in list(waiting[: 2 * LOOKAHEAD]):
            by_id[entry.job_id] = entry
            if entry.now:
                wants.append(Want(entry.job_id, None, True))
                continue
            request = self.request_of(entry.job_id)
            if request is not None and (
                self.too_late(entry.job_id, request) or not self.may_follow(waiting, entry, request)
            ):
                continue
            wants.append(Want(entry.job_id, self.nodes_for(request), False))
        if any(w.nodes for w in wants):
            board.alive = [n.ip for n in self.alive_nodes()]
        for want, nodes in choose(wants, board, self.overtaken):
            entry = by_id[want.job_id]
            waiting.remove(entry)
            ids = {n.ip: n.node_id for n in self.nodes_seen[1]}
            pin = (nodes, [ids.get(ip, "") for ip in nodes]) if nodes else None
            started = store.start(self.name, entry, self.allocation, pin)
            self.requests.pop(want.job_id, None)
            self.overtaken.pop(want.job_id, None)
            if started is None:
                board.held.pop(want.job_id, None)
                continue
            out.append(started)
        return out

    def request_of(self, job_id: str) -> JobRequest | None:
        """A queued job's request, read once (None when unreadable: store.start sets it aside)."""
        if job_id not in self.requests:
            try:
                self.requests[job_id] = read_job(self.name, job_id).request
            except ClusterError:
                self.requests[job_id] = None
        return self.requests[job_id]

    def nodes_for(self, request: JobRequest | None) -> int | None:
        """Whole nodes a packed job occupies; None: the whole cluster (it declared nothing)."""
        needs = request.needs if request is not None else {}
        if not needs:
            return None
        return nodes_wanted(needs, self.held())

    def held(self) -> tuple[int, int, int]:
        """The nodes the cluster counts and their shape, with its grown allocations (read at most
        every NODES_EVERY seconds)."""
        when, held = self.held_seen
        if held is None or self.clock() - when > NODES_EVERY:
            try:
                grown = records.read(self.name).grown
                held = self.cluster.model_copy(update={"grown": grown}).held if grown else self.cluster.held
            except ClusterError:  # (unreadable a moment: what was counted last)
                held = held or self.cluster.held
            self.held_seen = (self.clock(), held)
        return held

    def alive_nodes(self) -> list[NodeSummary]:
        """Ray's alive nodes, asked at most every NODES_EVERY seconds: those of the counted shape
        (a head without GPUs beside grown GPU nodes is left out: a packed job's work goes there)."""
        if self.clock() - self.nodes_seen[0] > NODES_EVERY:
            record = records.read(self.name)
            order = {h: i for i, h in enumerate(record.nodes)}
            entries = node_entries.read_node_entries(self.name)
            rank = {e.get("ip"): order.get(h, len(order)) for h, e in entries.items()}
            found = sorted(self.api.alive_nodes(), key=lambda n: (rank.get(n.ip, len(rank)), n.ip))
            if record.gpu_grown:
                found = [n for n in found if n.resources.get("GPU")]
            self.nodes_seen = (self.clock(), found)
        return self.nodes_seen[1]

    def say(self, job_id: str, why: str) -> None:
        """Tell a queued job's ledger why it waits (once per reason)."""
        if self.deferred.get(job_id) != why:
            self.deferred[job_id] = why
            update_job(self.name, job_id, message=why)

    def too_late(self, job_id: str, request: JobRequest) -> bool:
        """The job needs more walltime than this allocation has left."""
        need, end = request.min_time, self.cluster.walltime_end
        if need is None or not end:
            return False
        left = end - time.time()
        if left >= need:
            return False
        self.say(job_id, f"waits for an allocation with {_hm(need)} left (min_time; {_hm(max(0, left))} now)")
        return True

    def may_follow(self, waiting: list[Entry], entry: Entry, request: JobRequest) -> bool:
        """Its dependencies ended as asked (read at most every DEPS_EVERY s per job); one that can
        never be met cancels the job, with the reason."""
        if not request.after:
            return True
        if self.clock() - self.dep_checked.get(entry.job_id, -1e9) < DEPS_EVERY:
            return False
        self.dep_checked[entry.job_id] = self.clock()
        verdict = deps.verdict(self.name, request.after)
        if verdict.ready:
            self.dep_checked.pop(entry.job_id, None)
            return True
        if verdict.never:
            waiting.remove(entry)
            with contextlib.suppress(ClusterError):  # (started or cancelled meanwhile)
                store.cancel(self.name, entry.job_id, f"cancelled: {verdict.reason}")
                log.info("%s CANCELLED: %s", entry.job_id, verdict.reason)
            return False
        self.say(entry.job_id, verdict.reason)
        return False


def _hm(seconds: float) -> str:
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
