"""Grown allocations leaving the cluster (`raystack shrink`, or SLURM's walltime warning for the
grown allocation: its script leaves the flag, as the head's does): a duty of the head's node program.

Their Ray nodes are drained through Ray's GCS drain API (`ray drain-node`, the API autoscaler v2
uses): nothing new lands there. A queued job with an actor or a task there is stopped and put
back in the queue (`evicted`: the runner does it, allocation/runner/retry.py); so is one whose work
was lost with an allocation that ended unannounced (scancel, a preemption). Once no actor or task
runs on them (or the allocation's drain deadline has passed), the record says `released`: their
node programs stop their Ray and leave, and `shrink` ends the allocation.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import Callable
from typing import NamedTuple

from raystack.adapters.allocator import AllocInfo, AllocState, allocator
from raystack.adapters.ray import Dashboard, NodeSummary, drain_argv
from raystack.allocation.node.rayproc import tcp_open
from raystack.errors import RayApiError, RaystackError
from raystack.store import cluster as records
from raystack.store import node_entries, paths
from raystack.store import queue as store
from raystack.store.cluster import ClusterRecord, Grown
from raystack.store.ledger import JobRecord, read_job, update_job

log = logging.getLogger("raystack.node")
CHECK_ENDED = 10.0  # seconds between the scheduler's answers on whether a grown allocation ended
ANSWER = 2.0  # seconds a node's raylet may take to accept a connection before it counts as lost
LOST_RECENT = 120.0  # seconds after its node's death within which a job's failure is put on it


def nodes_of(record: ClusterRecord, grown: Grown, alive: list[NodeSummary]) -> list[NodeSummary]:
    """The alive Ray nodes of a grown allocation (by the addresses its node programs announced)."""
    ips = node_entries.allocation_ips(record.name, grown.alloc_id)
    return [n for n in alive if n.ip in ips and not n.is_head]


class Leaving:
    """Each pass: drain what `shrink` asked to leave; release it once idle or at its deadline."""

    def __init__(
        self,
        name: str,
        dashboard: Callable[[], Dashboard | None],
        env: dict[str, str],
        now: Callable[[], float] = time.time,
        run: Callable[[list[list[str]], dict[str, str]], list[str | None]] | None = None,
        info: Callable[[str, str], AllocInfo | None] | None = None,
    ):
        self.name, self.dashboard, self.env, self.now = name, dashboard, env, now
        self.run = run or drain
        self.busy: dict[str, int] = {}  # (the work last seen on each leaving allocation's nodes)
        self.asked: dict[str, float] = {}  # (when the scheduler was last asked whether one ended)
        self.unknown: set[str] = set()  # (said GONE once)
        self.info = info or ask

    def __call__(self) -> None:
        record = records.read(self.name)
        api = self.dashboard()
        for entry in record.grown:
            grown: Grown | None = entry
            if not entry.released and self.gone(record, entry, api):
                continue
            if not entry.leaving and not entry.released and self.warned(entry):
                left = max(5.0, (entry.walltime_end or self.now()) - self.now() - 15)
                grown = records.note_grown(self.name, entry.alloc_id, leaving="its walltime", deadline=left)
            if api is not None and grown is not None and grown.leaving and not grown.released:
                self.step(record, grown, api)

    def gone(self, record: ClusterRecord, grown: Grown, api: Dashboard | None) -> bool:
        """A grown allocation that ended unreleased (scancel, a preemption, its walltime passed
        unwarned, SLURM refused it): released in the record, so that nobody counts its nodes, and
        the jobs that had work on its nodes are put back in the queue. Asked of the scheduler every
        CHECK_ENDED seconds."""
        if self.now() - self.asked.get(grown.alloc_id, -1e18) < CHECK_ENDED:
            return False
        self.asked[grown.alloc_id] = self.now()
        info = self.info(record.backend, grown.alloc_id)
        if info is None or not info.state.is_terminal():
            self.unknown.discard(grown.alloc_id)
            return False
        if info.state is AllocState.GONE and grown.alloc_id not in self.unknown:
            self.unknown.add(grown.alloc_id)  # (GONE is believed when said twice, a check apart)
            return False
        reason = f", {info.reason}" if info.reason and info.reason != "None" else ""
        why = f"it ended: {info.state_text}{reason}"
        log.warning("grown allocation %s %s; its nodes are no longer the cluster's", grown.alloc_id, why)
        self.mark(grown.alloc_id, leaving=grown.leaving or why, released=self.now())
        if api is not None:  # (the runner also finds them when they fail first: allocation/runner/retry.py)
            current = records.read(self.name)

            def lost(ray_job: str) -> str | None:
                found = lost_with(current, api, ray_job, self.info, self.now)
                return found.why if found else None

            with contextlib.suppress(RayApiError):
                self.evict(api, lost)
        self.tell_waiting(grown)
        return True

    def warned(self, grown: Grown) -> bool:
        """SLURM's walltime warning reached the grown allocation's script (it left the flag)."""
        return paths.cluster(self.name).warning(grown.alloc_id).exists()

    def step(self, record: ClusterRecord, grown: Grown, api: Dashboard) -> None:
        nodes = nodes_of(record, grown, api.alive_nodes())
        if grown.drained is None:
            why = grown.leaving or "shrink"
            argvs = [drain_argv(str(record.gcs_address), n.node_id, why, grown.deadline) for n in nodes]
            for node, refused in zip(nodes, self.run(argvs, self.env), strict=True):
                if refused:
                    log.warning(
                        "Ray did not drain node %s of allocation %s: %s", node.ip, grown.alloc_id, refused
                    )
            log.info("allocation %s leaving (%s): %d Ray nodes drained", grown.alloc_id, why, len(nodes))
            grown = self.mark(grown.alloc_id, drained=self.now()) or grown
        try:  # (in the same pass: a job with work there is stopped at once)
            work = [job for n in nodes for job in api.node_work(n.node_id)]
            busy = len(work)
            if busy != self.busy.get(grown.alloc_id):
                log.info("allocation %s leaving: %d actors and tasks on its nodes", grown.alloc_id, busy)
                self.busy[grown.alloc_id] = busy
            leaves = f"allocation {grown.alloc_id} leaves the cluster ({grown.leaving})"
            if work:
                self.evict(api, lambda ray_job: leaves if ray_job in work else None)
        except RayApiError as exc:
            log.warning("allocation %s leaving: the State API did not answer (%s)", grown.alloc_id, exc)
            busy = -1  # (wait for the deadline or the next pass)
        late = self.now() - (grown.drained or self.now()) >= grown.deadline
        if busy == 0 or late:
            why = "its nodes are idle" if busy == 0 else f"its drain deadline ({grown.deadline:.0f}s) passed"
            log.info("allocation %s released: %s", grown.alloc_id, why)
            self.mark(grown.alloc_id, released=self.now())
            with contextlib.suppress(RaystackError):  # (its node programs leave by themselves too)
                allocator(record.backend).cancel(grown.alloc_id)
            self.tell_waiting(grown)

    def tell_waiting(self, grown: Grown) -> None:
        """Queued jobs that need more nodes than remain wait, and say why and what to do."""
        held = records.read(self.name).nodes_held
        for entry in store.waiting(self.name)[:64]:
            with contextlib.suppress(RaystackError, OSError):
                record = read_job(self.name, entry.job_id)
                want = (record.request.needs or {}).get("nodes") or 0
                if want > held:
                    left = f"allocation {grown.alloc_id} left ({grown.leaving})"
                    fix = f"`raystack grow -N {want - held}`, or cancel it"
                    message = f"waits: it needs {want} nodes and the cluster holds {held} since {left}; {fix}"
                    update_job(self.name, entry.job_id, message=message)

    def evict(self, api: Dashboard, why: Callable[[str], str | None]) -> None:
        """The queue's jobs for whose current attempt (by its Ray job id) `why` gives a reason: the
        runner stops them and puts them back in the queue (allocation/runner/retry.py)."""
        for job_id in store.active(self.name):
            record = read_job(self.name, job_id)
            if record.evicted or record.state.is_terminal() or not record.attempts:
                continue
            ray_job = record.attempts[-1].ray_job_id or ray_job_of(api, record)
            if ray_job and (reason := why(ray_job)):
                log.info("%s has work on the leaving nodes: stopped, to start again (%s)", job_id, reason)
                update_job(self.name, job_id, evicted=reason)

    def mark(self, alloc_id: str, **fields: object) -> Grown | None:
        return records.note_grown(self.name, alloc_id, **fields)


def ask(backend: str, alloc_id: str) -> AllocInfo | None:
    """The scheduler's answer on one allocation (Leaving's and lost_with's default)."""
    return allocator(backend).info(alloc_id)


class Lost(NamedTuple):
    how: str  # how it ended: "it ended: CANCELLED", "node node4 died"
    grown: Grown | None = None  # the grown allocation of the node, if it was one
    left: bool = False  # that grown allocation no longer runs (its nodes are no longer counted)
    node_id: str = ""  # the Ray node that died

    @property
    def why(self) -> str:
        if not self.left or self.grown is None:
            return f"{self.how} under it"
        return f"allocation {self.grown.alloc_id} left the cluster under it ({self.how})"


def answers(ip: str, port: int) -> bool:
    """Whether a node's raylet takes a connection (refused at once where the node lives but its
    Ray died; no answer within ANSWER seconds where the node itself is gone)."""
    return tcp_open(ip, port, ANSWER)


def lost_with(
    record: ClusterRecord,
    api: Dashboard,
    ray_job: str,
    info: Callable[[str, str], AllocInfo | None] = ask,
    now: Callable[[], float] = time.time,
    groups: tuple[str, ...] = (),
    named: frozenset[str] | set[str] = frozenset(),
) -> Lost | None:
    """Why a Ray job's work was lost with a node of the cluster: one of its Ray nodes, DEAD within
    the last LOST_RECENT seconds or not answering, on which the job had an actor, a task or a
    placement group's bundle (`groups`: by name, an SPMD job's made for it by the launch host;
    `named`: the ids Ray's own errors in its log gave), died (hardware, its node program killed,
    its Ray killed), or its grown allocation no longer runs (scancel, a preemption, a walltime
    past unwarned: SLURM ends Ray's processes before any drain). None for a failure of its own,
    or a node that died long before (its work there had ended then)."""
    by_ip = {ip: g for g in record.grown for ip in node_entries.allocation_ips(record.name, g.alloc_id)}
    entries = node_entries.read_node_entries(record.name)
    hosts = {str(e.get("ip")): host for host, e in entries.items()}
    ports = {str(e.get("ip")): e["raylet_port"] for e in entries.values() if e.get("raylet_port")}
    used = api.job_nodes(ray_job, groups) | named
    dead = {n.node_id: n for n in api.dead_nodes() if not n.ended or now() - n.ended <= LOST_RECENT}
    # (Ray marks a node DEAD 15-30 s after it stopped answering; a job fails at once: its raylet's
    # port, which its node program names, says sooner)
    for n in api.alive_nodes() if used - dead.keys() else []:
        if n.node_id in used and not n.is_head and n.ip in ports and not answers(n.ip, int(ports[n.ip])):
            dead[n.node_id] = n
    for node_id in sorted(used & dead.keys()):
        node = dead[node_id]
        grown = by_ip.get(node.ip)
        if grown is not None and grown.leaving:
            return Lost(grown.leaving, grown, left=True)
        alloc = info(record.backend, grown.alloc_id) if grown is not None else None
        if grown is not None and (alloc is None or alloc.state is not AllocState.RUNNING):
            how = (
                "ended"
                if alloc is None
                else f"{'ended:' if alloc.state.is_terminal() else 'is'} {alloc.state_text}"
            )
            return Lost(f"it {how}", grown, left=True)  # (PENDING again: preempted, requeued)
        return Lost(f"node {hosts.get(node.ip, node.ip)} died", grown, node_id=node_id)
    if dead:  # (said in the runner's log: why a failure near a node's death was the job's own)
        gone = sorted(hosts.get(n.ip, n.ip) for n in dead.values())
        log.info("Ray job %s: nodes %s died, none with its work (on %d nodes)", ray_job, gone, len(used))
    return None


def ray_job_of(api: Dashboard, record: JobRecord) -> str | None:
    """The Ray job id of a job's current attempt (the ledger has it once the job ends)."""
    info = api.info(record.attempts[-1].id)
    return str(info.job_id) if info is not None and info.job_id else None


def drain(argvs: list[list[str]], env: dict[str, str]) -> list[str | None]:
    """Run `ray drain-node` for every node at once; for each, None when Ray took the drain, else
    why not."""

    def start(argv: list[str]) -> subprocess.Popen[str] | str:
        try:
            return subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        except OSError as exc:
            return str(exc)

    def answer(proc: subprocess.Popen[str]) -> str | None:
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return "ray drain-node did not answer within 60s"
        return None if proc.returncode == 0 else (out.strip()[-300:] or f"exit {proc.returncode}")

    return [p if isinstance(p, str) else answer(p) for p in [start(a) for a in argvs]]
