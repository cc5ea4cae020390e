"""What every node program knows and does: its context from SLURM's environment, the `ray start`
command line, signals, polling with a deadline, reaping, GPU reports and teardown.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from raystack.adapters import local
from raystack.allocation.logsync import LogSync
from raystack.allocation.rayproc import RayProcess, gpu_processes, has_nvidia_smi
from raystack.errors import RaystackError
from raystack.spec.values import size_to_mb
from raystack.store import cluster as records
from raystack.store import paths, tls
from raystack.store.growth import DEFAULT_CAP
from raystack.store.raylogs import Caps
from raystack.waiting import REAL, Clock, Every, poll_until

log = logging.getLogger("raystack.node")
T = TypeVar("T")

POLL = 0.25  # seconds between readiness checks
BEAT = 5.0  # seconds between the head's heartbeats
BEAT_BYTES = 256  # the heartbeat file's fixed size (rewritten in place)
GPU_REFRESH = 30.0  # seconds after which a node rewrites an unchanged GPU report


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
    head_grace: float = 60.0  # seconds a worker waits for an unreachable head before leaving
    temp_root: Path | None = None  # the private folder (0700) that holds temp_dir
    tls: tls.Identity | None = None  # this node's certificate, on a `tls: true` cluster
    idle_timeout: float | None = None  # seconds idle after which the head ends the cluster
    join_window: int = 0  # workers registering with the head at once (0: all at once)
    ray_logs: Caps = field(default_factory=Caps)  # how Ray's logs are copied to the cluster folder
    log_sync: LogSync | None = None  # the copy's thread, once started (its last pass at teardown)
    entry: dict[str, Any] = field(default_factory=dict)  # this node's entry (nodes/<host>.json)
    folder_cap: int | None = DEFAULT_CAP  # bytes the cluster folder may take (pruned beyond)

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
    if env.get(local.ENV_ID):
        return local_context(env)
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
        head_grace=float(env.get("RAYSTACK_HEAD_GRACE") or 60),
        idle_timeout=float(env.get("RAYSTACK_IDLE_TIMEOUT") or 0) or None,
        join_window=int(env.get("RAYSTACK_JOIN_WINDOW") or 0),
        ray_logs=Caps.from_env(env),
        folder_cap=folder_cap(env),
    )


def folder_cap(env: dict[str, str]) -> int | None:
    """RAYSTACK_FOLDER_CAP (bytes; 0: no cap), the default for a hand-submitted script."""
    value = env.get("RAYSTACK_FOLDER_CAP")
    return DEFAULT_CAP if value is None else (int(value) or None)


def private_temp_dir(ctx: NodeContext) -> NodeContext:
    """Ray's temp dir inside a fresh folder only this user can enter (mkdtemp: 0700, checked).

    Ray makes its session, sockets and logs folders mode 0777 at a predictable path; inside a
    private folder no other user on the node can list, read, swap or connect to any of it."""
    prefix = ctx.temp_dir
    prefix.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=prefix.name + "-", dir=prefix.parent))
    st = root.lstat()
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700 or not stat.S_ISDIR(st.st_mode):
        raise RaystackError(f"{root} is not a private folder of this user; check {prefix.parent}")
    ctx.temp_root = root
    ctx.temp_dir = root / "r"  # (short: Unix socket paths inside it are limited to 107 bytes)
    return ctx


def node_certificate(ctx: NodeContext, env: dict[str, str]) -> NodeContext:
    """On a TLS cluster (RAYSTACK_TLS=1): this node's certificate, signed by the cluster's CA."""
    if env.get("RAYSTACK_TLS") == "1":
        tls.ensure_ca(ctx.cluster)
        ctx.tls = tls.issue_node_cert(ctx.cluster, ctx.ip, ctx.host, tls.node_dir(ctx.job_id))
        log.info("node certificate for %s (%s) in %s", ctx.host, ctx.ip, ctx.tls.cert.parent)
    return ctx


def local_context(env: dict[str, str]) -> NodeContext:
    """A local cluster (`raystack up --local`): one node, this machine, no SLURM. It binds to
    127.0.0.1 unless RAYSTACK_NODE_IP says otherwise: nothing is reachable from elsewhere."""
    job_id = env[local.ENV_ID]
    host = local.this_host()
    scratch = Path(env.get("RAYSTACK_LOCAL_SCRATCH") or "/tmp")
    store = env.get("RAYSTACK_OBJECT_STORE_MEMORY")
    return NodeContext(
        cluster=env["RAYSTACK_CLUSTER"],
        job_id=job_id,
        node_id=0,
        num_nodes=1,
        host=host,
        ip=env.get("RAYSTACK_NODE_IP") or "127.0.0.1",
        gpus=int(env.get("RAYSTACK_LOCAL_GPUS") or 0),
        cpus=int(env.get("RAYSTACK_LOCAL_CPUS") or local.cpu_count()),
        temp_dir=scratch / f"rs-local-{job_id.rsplit('-', 1)[-1]}",
        object_store_bytes=size_to_mb(store) * 1024 * 1024 if store else default_object_store_bytes(),
        join_timeout=float(env.get("RAYSTACK_JOIN_TIMEOUT") or 300),
        idle_timeout=float(env.get("RAYSTACK_IDLE_TIMEOUT") or 0) or None,
        ray_logs=Caps.from_env(env),
        folder_cap=folder_cap(env),
    )


# ---------------------------------------------------------------------------- ray processes
def metrics_on() -> bool:
    """The profile's `metrics: true` (RAYSTACK_METRICS=1 from the allocation script)."""
    return os.environ.get("RAYSTACK_METRICS") == "1"


def burst_settings(cores: int | None = None) -> dict[str, str]:
    """Ray settings that let the head's GCS ride out the registration burst of a large start
    (every raylet, then hundreds of actor workers, at once). Each only widens a timeout or a
    thread pool or thins steady background traffic, so nothing changes on a small cluster. Ray
    2.60's defaults in brackets; a profile's `env` overrides any of them."""
    cores = cores or os.cpu_count() or 1
    threads = str(max(8, cores // 4))
    return {
        # The GCS handles RegisterNode/RegisterWorker/GetNodeInfo on cores/4 threads [1 on a small
        # head]: more threads drain a burst of blocking handlers instead of queueing behind one.
        "RAY_gcs_server_rpc_server_thread_num": threads,
        "RAY_gcs_server_rpc_client_thread_num": threads,  # its replies to raylets, likewise
        # A raylet's or core worker's first connection to a busy GCS may take longer than 5 s [5].
        "RAY_gcs_rpc_server_connect_timeout_s": "30",
        # Synchronous GCS calls (`ray start`'s "Failed to get node info: Deadline Exceeded") [60].
        "RAY_gcs_server_request_timeout_seconds": "120",
        # Raylets and workers that lose the GCS during a burst exit after this [60].
        "RAY_gcs_rpc_server_reconnect_timeout_s": "120",
        # An actor's worker process not registered with its raylet by then is killed [60]: a burst
        # of several hundred actors starting on few cores takes longer.
        "RAY_worker_register_timeout_seconds": "120",
        # gRPC keepalive pings from every worker to the GCS [10 s / 20 s]: fewer during a burst;
        # dead nodes are still found by the GCS health checks, which are left as they are.
        "RAY_grpc_keepalive_time_ms": "60000",
        "RAY_grpc_keepalive_timeout_ms": "60000",
    }


def ray_env(ctx: NodeContext) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in burst_settings().items():
        env.setdefault(key, value)  # (the profile's env, exported by the allocation script, wins)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(paths.cluster(ctx.cluster).token),
        # NOTE: without this, SIGTERM makes `ray start --block` drain for up to 30 s.
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        RAY_USAGE_STATS_ENABLED="0",
        RAYSTACK_CLUSTER=ctx.cluster,
        RAYSTACK_ALLOCATION=ctx.job_id,  # SLURM's job id, or a local cluster's id
    )
    if not metrics_on():
        # Ray's Prometheus exporter listens on every interface without auth (task and actor
        # names, node addresses, resource use): off unless the profile asks (`metrics: true`).
        env["RAY_enable_metrics_collection"] = "0"
    if ctx.tls is not None:
        env.update(tls.ray_env(ctx.tls, tls.ca_cert(ctx.cluster)))
    else:
        for name in tls.RAY_VARIABLES:
            env.pop(name, None)  # (a shell that had a TLS cluster's `raystack env`)
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
        # With TLS the dashboard (plain HTTP) listens on 127.0.0.1 only, behind the HTTPS front
        # (allocation/tlsfront.py) on the node's address.
        inner = ctx.tls is not None
        argv += [
            "--head",
            f"--port={ports['gcs']}",
            f"--dashboard-host={'127.0.0.1' if inner else ctx.ip}",
            f"--dashboard-port={ports['dashboard_http' if inner else 'dashboard']}",
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


def on_signal(signum: int, _frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    alive: RayProcess | None = None,
    clock: Clock = REAL,
) -> T:
    """Poll `condition` until it returns a truthy value, and return that value.

    Raises after `timeout`, or at once when `alive` (the Ray process) has died.
    """

    def died() -> str | None:
        if alive is not None and not alive.alive():
            return f"ray start exited with code {alive.proc.returncode}"
        return None

    return poll_until(condition, timeout, what, clock, max_interval=POLL, abort=died)


# ---------------------------------------------------------------------------- housekeeping
class Reaper:
    """Reaps orphaned processes that died (we are their subreaper), except the ones a Popen owns.

    Without it every Ray worker that exits leaves a zombie until teardown.
    """

    def __init__(self, every: float = 2.0, clock: Clock = REAL):
        self.gate = Every(every, clock)
        self.owned: set[int] = set()  # pids whose exit status a Popen object collects itself

    def __call__(self) -> int:
        if not self.gate():
            return 0
        import psutil

        reaped = 0
        for child in psutil.Process().children():
            if child.pid in self.owned:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
                    reaped += 1
        return reaped


class GpuReport:
    """Publishes this node's leftover GPU memory in its node entry (read by the queue runner).

    nvidia-smi is asked every `every` seconds; the entry is written only when what it reports
    changed, or every `refresh` seconds: N nodes cost the shared filesystem N/refresh writes per
    second, and nothing is read (the node keeps its own entry in memory)."""

    def __init__(
        self, ctx: NodeContext, every: float = 1.0, refresh: float = GPU_REFRESH, clock: Clock = REAL
    ):
        self.ctx, self.clock = ctx, clock
        self.gate, self.refresh = Every(every, clock), refresh
        self.reported: list[tuple[int, int]] | None = None
        self.written = -float("inf")

    def __call__(self) -> None:
        if not self.ctx.gpus or not has_nvidia_smi() or not self.gate():
            return
        procs = gpu_processes()
        if procs == self.reported and self.clock.now() - self.written < self.refresh:
            return
        self.ctx.entry.update(gpu_procs=procs, gpu_checked=time.time())
        records.write_node_entry(self.ctx.cluster, self.ctx.host, self.ctx.entry)
        self.reported, self.written = procs, self.clock.now()


class Heartbeat:
    """The head's sign of life: a small file rewritten in place every BEAT seconds. Workers watch
    it beside the GCS port, and `raystack status` shows a head whose beat is stale as DEGRADED.

    Written with pwrite over the same bytes (no new file, no truncation): a full quota or a full
    disk on the shared filesystem does not stop it, since no new block is needed."""

    def __init__(self, ctx: NodeContext, clock: Clock = REAL, every: float = BEAT):
        self.path = paths.cluster(ctx.cluster).heartbeat
        self.ctx, self.gate, self.count = ctx, Every(every, clock), 0

    def __call__(self) -> None:
        if not self.gate():
            return
        self.count += 1
        beat = {"allocation": self.ctx.job_id, "host": self.ctx.host, "pid": os.getpid(), "n": self.count}
        text = json.dumps({**beat, "t": round(time.time(), 3)}).encode().ljust(BEAT_BYTES)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, text[:BEAT_BYTES], 0)
        finally:
            os.close(fd)


def ignore_signals() -> None:
    """From here on the node program finishes its teardown whatever SLURM sends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_ray(ctx: NodeContext, ray: RayProcess) -> None:
    """Stop this node's Ray processes (only ours: never a global `ray stop`) and its temp dir."""
    ignore_signals()
    ray.stop()
    if ctx.log_sync is not None:
        ctx.log_sync.final()  # (Ray has stopped: its logs are complete; the temp dir goes next)
    shutil.rmtree(ctx.temp_root or ctx.temp_dir, ignore_errors=True)
    if ctx.tls is not None:
        shutil.rmtree(ctx.tls.cert.parent, ignore_errors=True)
    log.info("node %s: Ray processes of cluster %s stopped", ctx.host, ctx.cluster)


def node_log(ctx: NodeContext, host: str) -> Path:
    return paths.cluster(ctx.cluster).node_log(host)
