"""What `raystack status` shows: one cluster's record joined with SLURM's and Ray's view."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from raystack.adapters.allocator import Allocator, AllocInfo, AllocState, allocator
from raystack.adapters.nccl import canary_words
from raystack.client.access import live_dashboard
from raystack.client.pending import never_starts, nodes_out, unseen_output
from raystack.durations import duration_text
from raystack.errors import ClusterError, RayApiError
from raystack.store import paths
from raystack.store.cluster import ClusterRecord, ClusterState, Grown, read_heartbeat
from raystack.store.files import read_dict
from raystack.store.queue import active, interrupted, waiting

HEAD_SILENT = 30.0  # seconds without a heartbeat after which a READY head shows as DEGRADED
DEGRADED = "DEGRADED"  # (shown, never recorded: the record keeps what the head last wrote)


@dataclass
class ClusterStatus:
    """A snapshot joining the record, SLURM's view and Ray's view of one cluster."""

    name: str
    state: str
    message: str
    allocation_id: str | None
    allocation_state: str | None  # the scheduler's word for it: RUNNING, PENDING, TIMEOUT, ...
    allocation_reason: str | None  # the scheduler's reason (why it waits, why it ended)
    time_left_s: int | None
    nodes_expected: int
    nodes_alive: int | None
    gpus: float | None
    cpus: float | None
    dashboard_url: str | None
    ray_error: str | None = None
    backend: str = "slurm"  # where the allocation runs: slurm, or local (this machine)
    running_job: str | None = None
    queued_jobs: int = 0
    chain_index: int = 1
    chain_count: int = 1
    next_allocation_id: str | None = None  # the chain's next allocation, pending on this one
    next_state: str | None = None
    next_reason: str | None = None
    resuming_jobs: list[str] | None = None  # INTERRUPTED: they resume in the next allocation
    idle_s: float | None = None  # idle (nothing queued, running or attached) for this long
    idle_timeout_s: float | None = None  # autostop after this long idle
    prometheus: str | None = None  # the head's Prometheus (on the head's loopback)
    interconnect: str | None = None  # the canary at READY: bus bandwidth, transports, warnings
    allocation_expected_start: int | None = None  # while it waits: the scheduler's estimate (epoch s)
    grown: list[dict[str, Any]] | None = None  # the grown allocations: id, nodes, state, hosts, time left
    max_nodes: int | None = None  # it grows for its queue up to this many nodes (`up --max-nodes`)
    scaling: str | None = None  # what growing it waits for now

    @property
    def ready(self) -> bool:
        return self.state == ClusterState.READY.value and self.nodes_alive == self.nodes_expected

    @property
    def ended(self) -> bool:
        return ClusterState(self.state).is_terminal()  # (a state of another version: not ended)

    # The names of 0.1 (deprecated: removed in the next release), in Python and in `status --json`.
    DEPRECATED: ClassVar[dict[str, str]] = {
        "slurm_state": "allocation_state",
        "slurm_reason": "allocation_reason",
        "slurm_expected_start": "allocation_expected_start",
    }

    @property
    def slurm_state(self) -> str | None:
        return self.allocation_state

    @property
    def slurm_reason(self) -> str | None:
        return self.allocation_reason

    @property
    def slurm_expected_start(self) -> int | None:
        return self.allocation_expected_start

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        old = {name: fields[new] for name, new in self.DEPRECATED.items()}
        return {**fields, "ready": self.ready, **old, "deprecated": sorted(self.DEPRECATED)}


def allocation_view(info: AllocInfo | None) -> dict[str, Any]:
    """The scheduler's view of the allocation, for ClusterStatus."""
    waits = info is not None and info.state is AllocState.WAITING
    return {
        "allocation_state": info.state_text if info else None,
        "allocation_reason": info.reason if info else None,
        "allocation_expected_start": (info.start_time or None) if info and waits else None,
    }


def ray_view(
    record: ClusterRecord, info: AllocInfo | None
) -> tuple[int | None, float | None, float | None, str | None]:
    """(nodes, GPUs, CPUs) alive in Ray for a starting or ready cluster, or why Ray was not read."""
    if record.state not in (ClusterState.READY, ClusterState.STARTING) or not record.dashboard_url:
        return None, None, None, None
    try:
        alive = live_dashboard(record, info).alive_nodes(timeout=5)
    # (ClusterError: SLURM says the allocation ended, or did not answer: no token was sent)
    except (RayApiError, ClusterError) as exc:
        return None, None, None, str(exc)
    gpus = sum(n.resources.get("GPU", 0) for n in alive)
    return len(alive), gpus, sum(n.resources.get("CPU", 0) for n in alive), None


def status_of(name: str, record: ClusterRecord) -> ClusterStatus:
    """A record (in SLURM's light) joined with what SLURM and Ray say now."""
    backend = allocator(record.backend)
    info = backend.info(record.allocation_id) if record.allocation_id else None
    time_left = backend.time_left(info)
    nodes, gpus, cpus, ray_error = ray_view(record, info)
    running = [] if record.state.is_terminal() else active(name)  # (an ended cluster runs nothing)
    nxt = backend.info(record.next_allocation_id) if record.next_allocation_id else None
    state, message = shown_state(name, record, info)
    if state == ClusterState.READY.value and nodes is not None and nodes < record.nodes_expected:
        message = (
            f"{nodes} of {record.nodes_expected} nodes in Ray now: a node's Ray left (whether it rejoins: "
            f"{paths.cluster(name).logs}/node-*.log); {message}"
        )
    return ClusterStatus(
        name=name,
        state=state,
        message=message,
        allocation_id=record.allocation_id,
        backend=record.backend,
        **allocation_view(info),
        time_left_s=time_left,
        nodes_expected=record.nodes_expected
        + sum(g.nodes for g in record.grown if g.hosts and not g.released),
        nodes_alive=nodes,
        gpus=gpus,
        cpus=cpus,
        dashboard_url=record.dashboard_url,
        ray_error=ray_error,
        running_job=running[0] if running else None,
        queued_jobs=len(waiting(name)),
        chain_index=record.chain_index,
        chain_count=record.chain_count,
        next_allocation_id=record.next_allocation_id,
        next_state=nxt.state_text if nxt else None,
        next_reason=nxt.reason if nxt else None,
        resuming_jobs=interrupted(name),
        idle_s=round(time.time() - record.idle_since, 1)
        if record.idle_since and record.state is ClusterState.READY
        else None,
        idle_timeout_s=record.idle_timeout,
        prometheus=record.prometheus,
        interconnect=interconnect(record),
        grown=[grown_row(backend, g) for g in record.grown if not g.released] or None,
        max_nodes=record.max_nodes,
        scaling=record.scaling,
    )


def grown_lines(st: ClusterStatus) -> list[str]:
    """`raystack status`'s line for each grown allocation (and what growing waits for)."""
    scaling = st.scaling or "the queue asks for none more"
    lines = [f"up to {st.max_nodes} nodes: {scaling}"] if st.max_nodes else []
    for g in st.grown or []:
        scheduler = f"{g['scheduler_state'] or '?'}" + (f" ({g['reason']})" if g["reason"] else "")
        hosts = f" on {', '.join(g['hosts'])}" if g["hosts"] else ""
        left = f", {duration_text(g['time_left_s'])} left" if g["time_left_s"] is not None else ""
        lines.append(f"{g['allocation_id']} {g['state']}: {g['nodes']} node(s){hosts}, {scheduler}{left}")
    return lines


def grown_row(backend: Allocator, grown: Grown) -> dict[str, Any]:
    """One grown allocation as `status` shows it: what the scheduler says of it, and raystack."""
    info = backend.info(grown.alloc_id)
    state = "leaving" if grown.leaving else "joined" if grown.hosts else "waiting"
    return {
        "allocation_id": grown.alloc_id,
        "nodes": grown.nodes,
        "gpus_per_node": grown.gpus_per_node,
        "state": state,
        "scheduler_state": info.state_text if info else None,
        "reason": info.reason if info and info.state is AllocState.WAITING else None,
        "hosts": grown.hosts,
        "time_left_s": backend.time_left(info),
    }


def interconnect(record: ClusterRecord) -> str | None:
    """What the interconnect canary found at READY, in one line (None: it did not run)."""
    return canary_words(record.canary) if record.canary else None


def shown_state(name: str, record: ClusterRecord, info: AllocInfo | None) -> tuple[str, str]:
    """The state and message `status` shows: DEGRADED when the head has gone silent; why
    nothing is heard from an allocation whose nodes do not see the cluster folder."""
    silent = head_silent(name, record)
    if silent is not None:
        return DEGRADED, (
            f"the head's node program has not been heard from for {silent:.0f}s (its log: "
            f"{paths.cluster(name).node_log(record.head_host or '?')}); {record.message}"
        )
    stuck = runner_failing(name, record)
    if stuck:
        return DEGRADED, f"{stuck}; {record.message}"
    waits = runner_waiting(name, record)
    if waits:
        return record.state.value, f"{record.message}; {waits}"
    if record.state is ClusterState.SUBMITTED:
        hint = never_starts(record, info) or nodes_out(record, info) or unseen_output(name, info, time.time())
        if hint:
            return record.state.value, f"{hint}; {record.message}"
    return record.state.value, record.message


def runner_says(name: str, record: ClusterRecord, key: str) -> dict | None:
    """What the live queue runner of a READY cluster's allocation wrote under `key` beside its
    heartbeat (allocation/runner/lease.py: "failing", "waiting"); None if nothing, or not live."""
    if record.state is not ClusterState.READY:
        return None
    lease = read_dict(paths.cluster(name).runner_lease)
    entry = lease.get(key)
    if lease.get("allocation") != record.allocation_id:
        return None
    if not isinstance(entry, dict) or time.time() - float(lease.get("heartbeat", 0)) > HEAD_SILENT:
        return None
    return entry


def runner_failing(name: str, record: ClusterRecord) -> str | None:
    """Why the queue does not move, when the live queue runner of this allocation has failed
    every pass for a minute or more (allocation/runner/lease.py writes it); else None."""
    failing = runner_says(name, record, "failing")
    if failing is None:
        return None
    since = time.strftime("%H:%M:%S", time.localtime(float(failing.get("since", 0))))
    return (
        f"the queue runner's every pass has failed since {since}, so no job starts or ends "
        f"({failing.get('error')}; its log: {paths.cluster(name).logs}/queue-runner.log)"
    )


def runner_waiting(name: str, record: ClusterRecord) -> str | None:
    """Why the next job does not start, when the live queue runner has waited for 30 s or more
    for an ended job's actors, placement groups or GPUs to be released (allocation/runner/lease.py
    writes it); else None."""
    waiting = runner_says(name, record, "waiting")
    if waiting is None:
        return None
    job = waiting.get("job")
    whose = "the jobs before the queue runner's restart" if job == "(restart)" else f"job {job}"
    at = time.strftime("%H:%M:%S", time.localtime(float(waiting.get("until", 0))))
    held = str(waiting.get("held"))
    kill = ""
    if " named " in held:
        kill = (
            f'. A detached actor outlives its job: end it with `eval "$(raystack env {name})"; '
            "ray kill-actor --name NAME --namespace NS --force --no-restart`"
        )
    return f"the next job waits for {whose} to release what it holds ({held}); at {at} it starts anyway{kill}"


def head_silent(name: str, record: ClusterRecord) -> float | None:
    """Seconds since the head's last heartbeat, when a live-looking cluster's head has been
    silent for over HEAD_SILENT seconds (a READY record then shows as DEGRADED); else None."""
    if record.state is not ClusterState.READY:
        return None
    beat = read_heartbeat(name)
    if beat is None or beat.get("allocation") != record.allocation_id:
        return None  # (a head of an older raystack beats not at all: judge what can be judged)
    age = time.time() - float(beat.get("t", 0))
    return age if age > HEAD_SILENT else None
