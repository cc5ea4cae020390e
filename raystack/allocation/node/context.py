"""What every node program knows: its context from its scheduler's environment (the adapter's facts),
its private temp folder and certificate, signals, and polling with a deadline. Its `ray start`
is in raystart.py, its periodic duties in duties.py.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from raystack.adapters.allocator import Allocator, allocator, node_facts
from raystack.allocation.node import tempsweep
from raystack.allocation.node.logsync import LogSync
from raystack.allocation.node.rayproc import RayProcess
from raystack.errors import RaystackError
from raystack.spec.profile import Caps
from raystack.spec.values import size_to_mb
from raystack.store import paths, tls
from raystack.store.cluster import GROW_VAR, ClusterRecord
from raystack.store.growth import DEFAULT_CAP
from raystack.waiting import REAL, Clock, poll_until

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
    alloc_id: str  # the allocation (SLURM's job id; a local one's own id)
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
    alive: int | None = None  # the lock held on temp_root while this node program lives (tempsweep)
    tls: tls.Identity | None = None  # this node's certificate, on a `tls: true` cluster
    idle_timeout: float | None = None  # seconds idle after which the head ends the cluster
    join_window: int = 0  # workers registering with the head at once (0: all at once)
    ray_logs: Caps = field(default_factory=Caps)  # how Ray's logs are copied to the cluster folder
    log_sync: LogSync | None = None  # the copy's thread, once started (its last pass at teardown)
    entry: dict[str, Any] = field(default_factory=dict)  # this node's entry (nodes/<host>.json)
    folder_cap: int | None = DEFAULT_CAP  # bytes the cluster folder may take (pruned beyond)
    folder_grace: float = 300.0  # seconds the cluster folder may be gone before the head ends
    backend: str = "slurm"  # where the allocation came from (adapters/allocator.py)
    restart: int = 0  # which run of the allocation this is (SLURM_RESTART_COUNT: a requeued job's)
    nodelist: str = ""  # the allocation's nodes in its scheduler's words (allocator.hosts expands it)
    cpus_per_node: list[int] = field(default_factory=list)  # each node's CPUs, where the scheduler says
    grown: bool = False  # a further allocation (`raystack grow`): every node a worker of the cluster

    @property
    def is_head(self) -> bool:
        return self.node_id == 0 and not self.grown

    @property
    def allocator(self) -> Allocator:
        return allocator(self.backend)

    def holds(self, record: ClusterRecord) -> bool:
        """Whether the record is this run's: this allocation, and not an earlier run of it (SLURM
        starts a requeued job again under its id, while the record still shows the last run)."""
        if self.grown:  # (its nodes serve whichever head runs the cluster, while the record keeps it)
            entry = record.grown_entry(self.alloc_id)
            return entry is not None and not entry.released
        return record.allocation_id == self.alloc_id and record.allocation_restart == self.restart

    def head_allocation(self, record: ClusterRecord) -> str | None:
        """The allocation whose head this node serves: its own, or the cluster's (grown)."""
        return record.allocation_id if self.grown else self.alloc_id


def default_object_store_bytes(shm: str = "/dev/shm") -> int:
    """min(30% of RAM, half of /dev/shm's free space): Ray's 30%-of-RAM default can exceed shm."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        stat = os.statvfs(shm)
        shm_free = stat.f_bavail * stat.f_frsize
    except OSError:
        shm_free = ram
    return max(100 * 1024 * 1024, int(min(0.3 * ram, 0.5 * shm_free)))


def node_ip(host: str, env: Mapping[str, str]) -> str:
    """This node's address: RAYSTACK_NODE_IP, else what its host name resolves to."""
    override = env.get("RAYSTACK_NODE_IP")
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
    """This node's context: the facts its scheduler's environment gives (adapters/allocator.py
    `node_facts`), and raystack's own settings (RAYSTACK_*: the profile's, through the script)."""
    backend, facts = node_facts(env)
    host = socket.gethostname().split(".")[0]
    store = env.get("RAYSTACK_OBJECT_STORE_MEMORY")
    # (one machine: binds 127.0.0.1 unless RAYSTACK_NODE_IP says otherwise)
    ip = env.get("RAYSTACK_NODE_IP") or "127.0.0.1" if facts.loopback else node_ip(host, env)
    # NOTE: Unix socket paths are limited to 107 bytes: keep the temp dir short. The host name
    # keeps it per node even where the "local" scratch is shared between nodes.
    temp_dir = scratch(env) / (facts.temp_name or f"rs-{facts.alloc_id}-{host}")
    return NodeContext(
        cluster=env.get("RAYSTACK_CLUSTER") or f"{backend}-{facts.alloc_id}",
        alloc_id=facts.alloc_id,
        backend=backend,
        node_id=facts.node_index,
        num_nodes=facts.node_count,
        host=host,
        ip=ip,
        gpus=facts.gpus,
        cpus=facts.cpus,
        temp_dir=temp_dir,
        object_store_bytes=size_to_mb(store) * 1024 * 1024 if store else default_object_store_bytes(),
        join_timeout=float(env.get("RAYSTACK_JOIN_TIMEOUT") or 300),
        head_grace=float(env.get("RAYSTACK_HEAD_GRACE") or 60),
        idle_timeout=float(env.get("RAYSTACK_IDLE_TIMEOUT") or 0) or None,
        join_window=int(env.get("RAYSTACK_JOIN_WINDOW") or 0),
        ray_logs=Caps.from_env(env),
        folder_cap=folder_cap(env),
        folder_grace=float(env.get("RAYSTACK_FOLDER_GRACE") or 300),
        restart=facts.restart,
        nodelist=facts.nodelist or host,
        cpus_per_node=list(facts.cpus_per_node),
        grown=env.get(GROW_VAR) == "1",
    )


def scratch(env: Mapping[str, str]) -> Path:
    """Where Ray's temp folders go: RAYSTACK_LOCAL_SCRATCH (a node-local disk), else /tmp."""
    return Path(env.get("RAYSTACK_LOCAL_SCRATCH") or "/tmp")


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
    ctx.alive = tempsweep.hold(root)
    tempsweep.sweep(prefix.parent, root)  # (those of node programs gone before theirs were removed)
    return ctx


def node_certificate(ctx: NodeContext, env: dict[str, str]) -> NodeContext:
    """On a TLS cluster (RAYSTACK_TLS=1): this node's certificate, signed by the cluster's CA."""
    if env.get("RAYSTACK_TLS") == "1":
        tls.ensure_ca(ctx.cluster)
        ctx.tls = tls.issue_node_cert(ctx.cluster, ctx.ip, ctx.host, tls.node_dir(ctx.alloc_id))
        log.info("node certificate for %s (%s) in %s", ctx.host, ctx.ip, ctx.tls.cert.parent)
    return ctx


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
def ignore_signals() -> None:
    """From here on the node program finishes its teardown whatever SLURM sends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def node_log(ctx: NodeContext, host: str) -> Path:
    return paths.cluster(ctx.cluster).node_log(host)
