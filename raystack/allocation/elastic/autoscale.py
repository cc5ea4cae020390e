"""The queue asks for nodes (`up --max-nodes M`): a duty of the head's node program.

Every CHECK seconds, once READY: the nodes the queue wants are those of the jobs in flight and of
the waiting ones that declared what they occupy (`needs`: nodes, or GPUs and CPUs rounded up to
whole nodes; a job that declares nothing takes the cluster as it is, and asks for nothing). When
that is more than the cluster holds, a grow allocation of the missing nodes is submitted (within
M, with the cluster's profile and walltime: `raystack grow`, as a user would), one at a time;
`status` says what it waits for. An allocation the queue grew is released once its nodes have
had no actor or task for idle_timeout (IDLE without one), and no job waits: drained through
Ray first (allocation/elastic/leaving.py). Why the queue runner's side decides rather than Ray's own
autoscaler: docs/development.md, "Growing the cluster".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from raystack.adapters.allocator import allocator
from raystack.adapters.ray import Dashboard
from raystack.allocation.elastic.leaving import nodes_of
from raystack.durations import duration_text
from raystack.errors import RayApiError, RaystackError
from raystack.plan.topology import nodes_wanted, plural
from raystack.store import cluster as records
from raystack.store import queue as store
from raystack.store.cluster import ClusterRecord, ClusterState, Grown
from raystack.store.ledger import JobRecord, JobState, Unreadable, read_job, update_job

log = logging.getLogger("raystack.node")
CHECK = 5.0  # seconds between looks
IDLE = 300.0  # seconds a grown allocation may idle when the cluster has no idle_timeout
LOOKAHEAD = 64  # waiting jobs counted


def wanted(record: ClusterRecord, jobs: list[JobRecord]) -> int:
    """The nodes the queue wants: those its jobs in flight and its waiting jobs occupy (pure)."""
    total = 0
    for job in jobs:
        nodes = nodes_wanted(job.request.needs or {}, record.held)
        if nodes is None and not job.state.is_terminal() and job.attempts:  # (in flight: the cluster)
            nodes = record.nodes_held
        total += nodes or 0
    return total


def waits(job: JobRecord) -> bool:
    """The job is in the queue, not yet (or no longer) given to Ray."""
    return job.state in (JobState.QUEUED, JobState.INTERRUPTED)


class Autoscale:
    def __init__(
        self,
        name: str,
        dashboard: Callable[[], Dashboard | None],
        now: Callable[[], float] = time.time,
        grow: Callable[[str, int, float | None, Grown | None], str] | None = None,
    ):
        self.name, self.dashboard, self.now = name, dashboard, now
        self.grow = grow or submit_grow
        self.checked = -1e18
        self.idle_from: dict[str, float] = {}  # grown allocation -> since when its nodes idle

    def __call__(self) -> None:
        if self.now() - self.checked < CHECK:
            return
        self.checked = self.now()
        record = records.read(self.name)
        if not record.max_nodes or record.state is not ClusterState.READY or record.ending:
            return
        jobs = self.jobs()
        self.release_idle(record, any(waits(j) for j in jobs))
        self.ask(records.read(self.name), jobs)

    def jobs(self) -> list[JobRecord]:
        found = []
        for job_id in [*store.active(self.name), *(e.job_id for e in store.waiting(self.name)[:LOOKAHEAD])]:
            try:
                found.append(read_job(self.name, job_id))
            except (Unreadable, OSError, RaystackError):
                continue
        return found

    def ask(self, record: ClusterRecord, jobs: list[JobRecord]) -> None:
        """Grow by what the queue wants beyond the nodes held (one allocation waiting at a time)."""
        waiting = [g for g in record.grown if not g.hosts and not g.released and not g.leaving]
        want = min(wanted(record, jobs), record.max_nodes or 0)
        if waiting:
            g = waiting[0]
            info = allocator(record.backend).info(g.alloc_id)
            words = f"{info.state_text}: {info.reason}" if info and info.reason not in ("", "None") else "?"
            self.say(
                record, f"waiting for {plural(g.nodes, 'more node')} (allocation {g.alloc_id} {words})", jobs
            )
            return
        more = want - record.nodes_held
        if more <= 0:
            self.say(record, None)
            return
        try:
            alloc_id = self.grow(self.name, more, record.walltime, record.gpu_grown)
        except RaystackError as exc:
            self.say(record, f"could not grow by {plural(more, 'node')}: {exc}")
            return
        records.note_grown(self.name, alloc_id, auto=True, nodes=more)
        log.info(
            "the queue wants %d nodes, the cluster holds %d: grew by %s", want, record.nodes_held, alloc_id
        )
        self.say(record, f"waiting for {plural(more, 'more node')} (allocation {alloc_id} submitted)", jobs)

    def release_idle(self, record: ClusterRecord, jobs_wait: bool) -> None:
        """Grown allocations of the queue whose nodes ran nothing for the idle time: released."""
        api = self.dashboard()
        limit = record.idle_timeout or IDLE
        for g in record.grown:
            if not g.auto or not g.hosts or g.leaving or g.released or api is None:
                continue
            busy = jobs_wait or self.busy(record, g, api)
            since = self.idle_from.setdefault(g.alloc_id, self.now()) if not busy else None
            if since is None:
                self.idle_from.pop(g.alloc_id, None)
            elif self.now() - since >= limit:
                log.info("allocation %s idle for %s: released", g.alloc_id, duration_text(limit))
                records.note_grown(
                    self.name, g.alloc_id, leaving=f"idle for {duration_text(limit)}", deadline=0.0
                )

    def busy(self, record: ClusterRecord, grown: Grown, api: Dashboard) -> bool:
        try:
            nodes = nodes_of(record, grown, api.alive_nodes())
            return any(api.node_work(n.node_id) for n in nodes)
        except RayApiError:
            return True  # (unknown counts as busy)

    def say(self, record: ClusterRecord, scaling: str | None, jobs: Sequence[JobRecord] = ()) -> None:
        """Into the record (`status`), and the first waiting job's message (`queue`)."""
        if record.scaling == scaling:
            return
        records.update(self.name, scaling=scaling)
        first = next((j for j in jobs if waits(j)), None)
        if first is not None and scaling:
            with contextlib.suppress(RaystackError, OSError):
                update_job(self.name, first.id, message=scaling)


def submit_grow(name: str, nodes: int, walltime: float | None, like: Grown | None = None) -> str:
    """`raystack grow NAME -N nodes --no-wait` (the command a user runs): its allocation's id. Run
    without this allocation's own scheduler variables (the new one must not inherit them). `like`:
    a grown allocation whose partition and node shape it asks for (GPU nodes beside a CPU head)."""
    argv = [
        sys.executable,
        "-m",
        "raystack.cli",
        "grow",
        name,
        "-N",
        str(nodes),
        "--no-wait",
        "--json",
        "--for-queue",
    ]
    if walltime:
        argv += ["--time", f"{max(1, int(walltime // 60))}"]
    if like is not None:
        argv += ["--gpus-per-node", str(like.gpus_per_node)]
        argv += ["--cpus-per-task", str(like.cpus_per_node)] if like.cpus_per_node else []
        argv += ["--partition", like.queue] if like.queue else []
    mine = allocator(records.read(name).backend).own_env
    env = {k: v for k, v in os.environ.items() if not (mine and k.startswith(mine))}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RaystackError(lines[-1] if lines else f"raystack grow: exit {done.returncode}")
    return str(json.loads(done.stdout)["alloc_id"])
