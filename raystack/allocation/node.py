"""The per-node program inside an allocation: `srun --ntasks-per-node=1 python -m raystack.allocation.node`.

Node 0 (SLURM_NODEID=0) starts the Ray head, records its address in the cluster folder, and
marks the cluster READY once every node, GPU and CPU is registered and the Jobs API answers an
authenticated request. The other nodes join the head and stay alive while it lives. Every node
stops only its own Ray processes (never a global `ray stop`, which would kill other clusters
sharing the node).

Configuration comes from the environment the allocation script exports:
RAYSTACK_HOME, RAYSTACK_CLUSTER, RAYSTACK_LOCAL_SCRATCH, RAYSTACK_OBJECT_STORE_MEMORY,
RAYSTACK_JOIN_TIMEOUT, plus SLURM's own variables.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TypeVar

from raystack.adapters import slurm
from raystack.adapters.ray import Dashboard, NodeSummary
from raystack.allocation.rayproc import (
    RayProcess,
    become_subreaper,
    gpu_processes,
    has_nvidia_smi,
    node_ports,
    tcp_open,
)
from raystack.errors import RaystackError
from raystack.spec.values import size_to_mb
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterState
from raystack.store.files import make_private_dirs
from raystack.store.queue import interrupt_in_flight

log = logging.getLogger("raystack.node")
T = TypeVar("T")

POLL = 0.25  # seconds between readiness checks


# ---------------------------------------------------------------------------- node facts
@dataclass
class NodeContext:
    """What one node knows about itself and its allocation."""

    cluster: str
    job_id: str
    node_id: int
    num_nodes: int
    host: str
    ip: str
    gpus: int
    cpus: int
    temp_dir: Path
    object_store_bytes: int
    join_timeout: float
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_head(self) -> bool:
        return self.node_id == 0


def parse_cpus_per_node(value: str) -> list[int]:
    """SLURM_JOB_CPUS_PER_NODE, e.g. '16(x3),8' -> [16, 16, 16, 8]."""
    counts: list[int] = []
    for part in filter(None, value.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"cannot read SLURM_JOB_CPUS_PER_NODE={value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def gpus_on_node(env: dict[str, str]) -> int:
    """GPUs SLURM gave this node: SLURM_GPUS_ON_NODE, else the CUDA_VISIBLE_DEVICES entries."""
    if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(env["SLURM_GPUS_ON_NODE"])
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in visible.split(",") if d.strip()]) if visible else 0


def default_object_store_bytes(shm: str = "/dev/shm") -> int:
    """min(30% of RAM, half of /dev/shm's free space): Ray's 30%-of-RAM default can exceed shm."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        stat = os.statvfs(shm)
        shm_free = stat.f_bavail * stat.f_frsize
    except OSError:
        shm_free = ram
    return max(100 * 1024 * 1024, int(min(0.3 * ram, 0.5 * shm_free)))


def node_ip(host: str) -> str:
    """This node's address: RAYSTACK_NODE_IP, else what its host name resolves to."""
    override = os.environ.get("RAYSTACK_NODE_IP")
    if override:
        return override
    ip = socket.gethostbyname(host)
    if ip.startswith("127."):
        raise RaystackError(
            f"host name {host} resolves to {ip}; set RAYSTACK_NODE_IP in the profile's env "
            "to the node's cluster-network address"
        )
    return ip


def context_from_env(env: dict[str, str]) -> NodeContext:
    job_id = env["SLURM_JOB_ID"]
    host = socket.gethostname().split(".")[0]
    cpus = int(env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
    scratch = Path(env.get("RAYSTACK_LOCAL_SCRATCH") or "/tmp")
    store = env.get("RAYSTACK_OBJECT_STORE_MEMORY")
    return NodeContext(
        cluster=env.get("RAYSTACK_CLUSTER") or f"slurm-{job_id}",
        job_id=job_id,
        node_id=int(env.get("SLURM_NODEID", "0")),
        num_nodes=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1),
        host=host,
        ip=node_ip(host),
        gpus=gpus_on_node(env),
        cpus=cpus,
        # NOTE: Unix socket paths are limited to 107 bytes: keep the temp dir short. The host
        # name keeps it per node even where the "local" scratch is shared between nodes.
        temp_dir=scratch / f"rs-{job_id}-{host}",
        object_store_bytes=size_to_mb(store) * 1024 * 1024 if store else default_object_store_bytes(),
        join_timeout=float(env.get("RAYSTACK_JOIN_TIMEOUT") or 300),
    )


# ---------------------------------------------------------------------------- ray processes
def ray_env(ctx: NodeContext) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(paths.cluster(ctx.cluster).token),
        # NOTE: without this, SIGTERM makes `ray start --block` drain for up to 30 s.
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        RAY_USAGE_STATS_ENABLED="0",
        RAYSTACK_CLUSTER=ctx.cluster,
    )
    env.pop("RAY_ADDRESS", None)
    # NOTE: a job's `python` is the first on the PATH of `ray start`: make it this venv's.
    bindir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bindir:
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    return env


def ray_start_argv(ctx: NodeContext, ports: dict[str, int], head_address: str | None) -> list[str]:
    ray = str(Path(sys.executable).with_name("ray"))
    argv = [
        ray if Path(ray).exists() else "ray",
        "start",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={ctx.ip}",
        f"--temp-dir={ctx.temp_dir}",
        f"--num-cpus={ctx.cpus}",
        f"--num-gpus={ctx.gpus}",
        f"--object-store-memory={ctx.object_store_bytes}",
        f"--object-manager-port={ports['object_manager']}",
        f"--node-manager-port={ports['node_manager']}",
        f"--dashboard-agent-listen-port={ports['agent_listen']}",
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--metrics-export-port={ports['metrics']}",
        f"--runtime-env-agent-port={ports['runtime_env']}",
        f"--min-worker-port={ports['min_worker']}",
        f"--max-worker-port={ports['max_worker']}",
    ]
    if head_address is None:
        argv += [
            "--head",
            f"--port={ports['gcs']}",
            f"--dashboard-host={ctx.ip}",
            f"--dashboard-port={ports['dashboard']}",
            f"--ray-client-server-port={ports['client_server']}",
            "--include-dashboard=true",
        ]
    else:
        argv += [f"--address={head_address}"]
    return argv


class Stop(BaseException):
    """Raised from the signal handler: SLURM (scancel, walltime) asked this node to stop.

    A BaseException, so that the `except Exception` of library code cannot swallow it.
    """


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def wait_for(
    condition: Callable[[], T | None], timeout: float, what: str, alive: RayProcess | None = None
) -> T:
    """Poll `condition` until it returns a truthy value, and return that value.

    Raises after `timeout`, or at once when `alive` (the Ray process) has died.
    """
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not (value := condition()):
        if alive is not None and not alive.alive():
            raise RaystackError(
                f"ray start exited with code {alive.proc.returncode} while waiting for {what}"
            )
        if time.monotonic() > deadline:
            raise RaystackError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, POLL)
    return value


# ---------------------------------------------------------------------------- head
def missing_nodes(ctx: NodeContext, alive: list[NodeSummary]) -> list[str]:
    """Host names expected in the allocation whose address is not among Ray's alive nodes."""
    entries = records.read_node_entries(ctx.cluster)
    alive_ips = {n.ip for n in alive}
    record = records.read(ctx.cluster)
    return [h for h in record.nodes if entries.get(h, {}).get("ip") not in alive_ips]


def node_log(ctx: NodeContext, host: str) -> Path:
    return paths.cluster(ctx.cluster).node_log(host)


def wait_ready(ctx: NodeContext, url: str, ray: RayProcess) -> None:
    """Until all nodes are alive with the expected GPUs and CPUs and the Jobs API answers."""
    dashboard = Dashboard(url, records.read_token(ctx.cluster))
    cpus_env = os.environ.get("SLURM_JOB_CPUS_PER_NODE", "")
    want_cpus = sum(parse_cpus_per_node(cpus_env)) if cpus_env else ctx.cpus * ctx.num_nodes
    want_gpus = ctx.gpus * ctx.num_nodes
    deadline = time.monotonic() + ctx.join_timeout
    nodes: list[NodeSummary] = []
    joined = -1
    while True:
        if not ray.alive():
            raise RaystackError(
                f"the Ray head exited with code {ray.proc.returncode}; see {node_log(ctx, ctx.host)}"
            )
        with contextlib.suppress(RaystackError):
            nodes = dashboard.alive_nodes()
            gpus = sum(n.resources.get("GPU", 0) for n in nodes)
            cpus = sum(n.resources.get("CPU", 0) for n in nodes)
            if len(nodes) != joined:
                joined = len(nodes)
                log.info("%d/%d nodes joined (%g GPUs, %g CPUs)", joined, ctx.num_nodes, gpus, cpus)
                records.update(
                    ctx.cluster,
                    nodes_joined=joined,
                    message=f"{joined}/{ctx.num_nodes} nodes joined",
                )
            if (
                joined >= ctx.num_nodes
                and gpus >= want_gpus
                and cpus >= want_cpus
                and dashboard.probe() is None
            ):
                return
        if time.monotonic() > deadline:
            raise RaystackError(_not_ready_message(ctx, nodes, want_gpus, want_cpus))
        time.sleep(POLL)


def _not_ready_message(ctx: NodeContext, nodes: list[NodeSummary], gpus: int, cpus: int) -> str:
    missing = missing_nodes(ctx, nodes)
    if missing:
        return (
            f"node {missing[0]} did not join within {ctx.join_timeout:.0f}s"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; "
            f"its log: {node_log(ctx, missing[0])}"
        )
    return (
        f"cluster not ready within {ctx.join_timeout:.0f}s: expected {gpus} GPUs and {cpus} CPUs "
        f"on {ctx.num_nodes} nodes and an answering Jobs API; see {node_log(ctx, ctx.host)}"
    )


def head_record_fields(ctx: NodeContext, ports: dict[str, int]) -> dict[str, object]:
    info = slurm.job_info(ctx.job_id)
    nodelist = os.environ.get("SLURM_JOB_NODELIST", ctx.host)
    return dict(
        state=ClusterState.STARTING,
        message=f"Ray head starting on {ctx.host}; waiting for nodes",
        slurm_job_id=ctx.job_id,
        head_host=ctx.host,
        head_ip=ctx.ip,
        ports=ports,
        gcs_address=f"{ctx.ip}:{ports['gcs']}",
        dashboard_url=f"http://{ctx.ip}:{ports['dashboard']}",
        nodes=slurm.hostnames(nodelist),
        nodes_expected=ctx.num_nodes,
        nodes_joined=0,
        gpus_per_node=ctx.gpus,
        cpus_per_node=ctx.cpus,
        ray_version=importlib.metadata.version("ray"),
        walltime_end=info.end_time if info and info.end_time else None,
    )


def run_head(ctx: NodeContext) -> int:
    ports = node_ports(ctx.ip, head=True)
    ray = RayProcess(ray_start_argv(ctx, ports, None), ray_env(ctx))
    try:
        # The ports are fixed before Ray starts, so the address is published at once and the
        # workers start alongside the head (their `ray start --address` waits for the GCS).
        records.update(ctx.cluster, **head_record_fields(ctx, ports))
        wait_for(lambda: tcp_open(ctx.ip, ports["gcs"]), 120, "the GCS to listen", ray)
        wait_ready(ctx, f"http://{ctx.ip}:{ports['dashboard']}", ray)
        records.update(
            ctx.cluster,
            state=ClusterState.READY,
            message=f"{ctx.num_nodes} nodes, {ctx.gpus * ctx.num_nodes} GPUs ready",
        )
        log.info("cluster %s READY", ctx.cluster)
        failure = supervise_head(ctx, ray)
    except Stop as stop:
        _finish(ctx, ClusterState.STOPPED, f"allocation ended ({stop}: raystack down, scancel or walltime)")
        _teardown(ctx, ray, interrupted=f"{stop}")
        return 0
    except (RaystackError, OSError) as exc:
        failure = str(exc)
    _finish(ctx, ClusterState.FAILED, failure)
    _teardown(ctx, ray, interrupted="the cluster failed")
    # A failed cluster must not hold its nodes until the walltime: the other nodes' tasks
    # would otherwise keep the allocation alive.
    with contextlib.suppress(RaystackError):
        slurm.scancel(ctx.job_id)
    return 1


def start_runner(ctx: NodeContext) -> subprocess.Popen:
    """The queue runner, a child of this node program (so teardown ends it too)."""
    logfile = open(paths.cluster(ctx.cluster).runner_log, "a")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "raystack.allocation.runner", ctx.cluster],
        env=ray_env(ctx),
        stdout=logfile,
        stderr=subprocess.STDOUT,
    )
    logfile.close()
    records.update(ctx.cluster, runner_pid=proc.pid)
    log.info("queue runner started (pid %d)", proc.pid)
    return proc


def supervise_head(ctx: NodeContext, ray: RayProcess) -> str:
    """While Ray lives: keep the queue runner alive (restarting it with back-off), report GPU use.

    Returns why the head ended (only when Ray itself died; signals arrive as Stop).
    """
    runner, started, backoff, restarts = start_runner(ctx), time.monotonic(), 0.5, 0
    while ray.alive():
        if runner.poll() is not None and time.monotonic() - started >= backoff:
            restarts += 1
            log.warning("queue runner exited with code %s; restarting (%d)", runner.returncode, restarts)
            backoff = 0.5 if time.monotonic() - started > 60 else min(backoff * 2, 30)
            runner, started = start_runner(ctx), time.monotonic()
            records.update(ctx.cluster, runner_restarts=restarts)
        report_gpu_use(ctx)
        time.sleep(POLL)
    return f"the Ray head exited with code {ray.proc.returncode}; see {node_log(ctx, ctx.host)}"


_last_gpu_report = 0.0


def report_gpu_use(ctx: NodeContext, every: float = 1.0) -> None:
    """Publish this node's leftover GPU memory in its node entry (read by the queue runner)."""
    global _last_gpu_report
    if time.monotonic() - _last_gpu_report < every or not ctx.gpus or not has_nvidia_smi():
        return
    _last_gpu_report = time.monotonic()
    entry = records.read_node_entries(ctx.cluster).get(ctx.host, {})
    entry.update(gpu_procs=gpu_processes(), gpu_checked=time.time())
    records.write_node_entry(ctx.cluster, ctx.host, entry)


def _finish(ctx: NodeContext, state: ClusterState, message: str) -> None:
    """Record the end; further signals are ignored so teardown completes."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("cluster %s %s: %s", ctx.cluster, state.value, message)
    record = records.read(ctx.cluster) if records.exists(ctx.cluster) else None
    if record is None or record.slurm_job_id in (None, ctx.job_id):
        records.update(ctx.cluster, state=state, message=message)


def _teardown(ctx: NodeContext, ray: RayProcess, interrupted: str | None = None) -> None:
    """Stop this node's Ray (and, on the head, the queue runner); `interrupted`: record why in the
    ledger of jobs that were running (after the runner is gone, so it cannot overwrite it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ray.stop()
    shutil.rmtree(ctx.temp_dir, ignore_errors=True)
    log.info("node %s: Ray processes of cluster %s stopped", ctx.host, ctx.cluster)
    if interrupted is not None:
        with contextlib.suppress(RaystackError, OSError):
            for job_id in interrupt_in_flight(ctx.cluster, interrupted):
                log.info("job %s was running when the allocation ended", job_id)


# ---------------------------------------------------------------------------- worker
def head_record(ctx: NodeContext) -> records.ClusterRecord | None:
    """The record once the head of *this* allocation has published its address."""
    if not records.exists(ctx.cluster):
        return None
    record = records.read(ctx.cluster)
    if record.slurm_job_id == ctx.job_id and (record.gcs_address or record.state.is_terminal()):
        return record
    return None


def head_ended(ctx: NodeContext) -> bool:
    record = records.read(ctx.cluster)
    return record.slurm_job_id == ctx.job_id and record.state.is_terminal()


def run_worker(ctx: NodeContext) -> int:
    record = wait_for(lambda: head_record(ctx), ctx.join_timeout, "the head to publish its address")
    if record.state.is_terminal() or not record.gcs_address:
        log.info("cluster %s is %s before this node joined; exiting", ctx.cluster, record.state.value)
        return 0
    head_ip, gcs_port = record.gcs_address.rsplit(":", 1)
    # NOTE: the head publishes its address before its GCS listens. A `ray start --address` that
    # finds no GCS blocks in a connect timeout and then sleeps 1 s per retry (ray 2.60,
    # Node._init_gcs_client), seconds lost: poll the port cheaply first.
    wait_for(
        lambda: tcp_open(head_ip, int(gcs_port), timeout=0.5) or head_ended(ctx),
        ctx.join_timeout,
        "the head's GCS to listen",
    )
    if head_ended(ctx):
        log.info("cluster %s ended before this node joined; exiting", ctx.cluster)
        return 0
    ray = RayProcess(ray_start_argv(ctx, node_ports(ctx.ip, head=False), record.gcs_address), ray_env(ctx))
    try:
        misses, seen = 0, False  # misses count only once the head has answered
        while ray.alive() and misses < 3:
            up = tcp_open(head_ip, int(gcs_port))
            seen = seen or up
            misses = 0 if up or not seen else misses + 1
            report_gpu_use(ctx)
            time.sleep(1)
        if misses >= 3 or (seen and not tcp_open(head_ip, int(gcs_port))):
            log.info("head %s is gone; leaving", record.gcs_address)
            return 0
        log.error("ray start exited with code %s while the head lives", ray.proc.returncode)
        return 1
    except Stop as stop:
        log.info("node %s stopping (%s)", ctx.host, stop)
        return 0
    finally:
        _teardown(ctx, ray)


# ---------------------------------------------------------------------------- entry point
def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
    )
    become_subreaper()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        ctx = context_from_env(dict(os.environ))
        make_private_dirs(paths.cluster(ctx.cluster))
        records.ensure_token(ctx.cluster)
        records.write_node_entry(
            ctx.cluster,
            ctx.host,
            {
                "ip": ctx.ip,
                "node_id": ctx.node_id,
                "pid": os.getpid(),
                "gpus": ctx.gpus,
                "cpus": ctx.cpus,
                "job_id": ctx.job_id,
                "started": time.time(),
            },
        )
        log.info(
            "node %s (%s) id %d of %d: %d GPUs, %d CPUs, cluster %s",
            ctx.host,
            ctx.ip,
            ctx.node_id,
            ctx.num_nodes,
            ctx.gpus,
            ctx.cpus,
            ctx.cluster,
        )
        sys.exit(run_head(ctx) if ctx.is_head else run_worker(ctx))
    except Stop as stop:
        log.info("stopped (%s) before Ray started", stop)
        sys.exit(0)
    except RaystackError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
