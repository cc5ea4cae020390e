"""Ray's processes on one node: free ports, `ray start --block` and everything it spawned, and
the GPU memory its descendants hold. Used by the node program (raystack.node).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import random
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from raystack.errors import RaystackError
from raystack.launch.launchers import killed_by
from raystack.launch.process import die_with_parent
from raystack.store.raylogs import ANSI

log = logging.getLogger("raystack.node")

WORKER_PORTS = 512  # size of each node's worker port range
_PR_SET_CHILD_SUBREAPER = 36


def _bindable(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


CLAIM_FOR = 600.0  # seconds a port chosen here stays off-limits to the next cluster starting here


@contextlib.contextmanager
def _claims() -> Iterator[dict[int, float]]:
    """The ports this user's raystack chose on this node lately (port -> until when), under a lock,
    written back at the end. The kernel may give a port that one head chose and released, before
    its Ray bound it, to a second head starting at the same moment: the claim keeps it apart."""
    path = os.path.join(tempfile.gettempdir(), f"raystack-ports-{os.getuid()}.json")
    try:  # (in a shared /tmp: never through a link, never a file someone else owns)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        if os.fstat(fd).st_uid != os.getuid():
            os.close(fd)
            raise PermissionError(f"{path} belongs to another user")
    except OSError as exc:  # (a read-only /tmp, a planted file: the kernel's choice alone)
        log.warning("ports chosen without claims (%s): %s", path, exc)
        yield {}
        return
    with os.fdopen(fd, "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            saved = {int(k): float(v) for k, v in json.loads(fh.read() or "{}").items()}
        except (ValueError, AttributeError, TypeError):
            saved = {}
        now = time.time()
        claims = {port: until for port, until in saved.items() if until > now}
        yield claims
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(claims))


def free_ports(count: int) -> list[int]:
    """Ports free on this node now (the kernel picks them) and not chosen by another cluster
    starting here (see _claims): two clusters never share one."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    with _claims() as claims:
        try:
            while len(ports) < count:
                if len(socks) > count + 1000:
                    raise RaystackError(f"no {count} free ports on this node")
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)  # (a claimed port stays bound meanwhile: not offered again)
                sock.bind(("", 0))
                if (port := sock.getsockname()[1]) not in claims:
                    ports.append(port)
        finally:
            for sock in socks:
                sock.close()
        claims.update(dict.fromkeys(ports, time.time() + CLAIM_FOR))
    return ports


def free_port_range(size: int = WORKER_PORTS) -> tuple[int, int]:
    """A block of `size` ports, all free now, outside the kernel's ephemeral range."""
    for _ in range(200):
        base = random.randrange(10000, 32000 - size)
        if all(_bindable("", p) for p in range(base, base + size, 16)):
            return base, base + size - 1
    raise RaystackError(f"no free block of {size} ports on this node")


def node_ports(head: bool, tls: bool = False) -> dict[str, int]:
    names = [
        "object_manager",
        "node_manager",
        "agent_listen",
        "agent_grpc",
        "metrics",
        "runtime_env",
    ]
    if head:
        # Ray's autoscaler and dashboard serve Prometheus counters on fixed ports (44217, 44227),
        # all interfaces, no auth: per-cluster ports instead, held closed unless metrics are on.
        names += ["gcs", "dashboard", "client_server", "autoscaler_metrics", "dashboard_metrics"]
        if tls:
            names.append("dashboard_http")  # Ray's own, on 127.0.0.1 behind the HTTPS front
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    ports["min_worker"], ports["max_worker"] = free_port_range()
    return ports


def hold_port(port: int) -> socket.socket:
    """Listen on 127.0.0.1:port and never accept: nothing else can listen on that port on any
    interface while this socket lives (how the unauthenticated endpoints Ray has no switch for
    are kept closed: their bind fails and Ray logs it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


# `ray start --block` names the daemons whose exit ended it: "Some Ray subprocesses exited
# unexpectedly:" then one "<name> [exit code=N]" line each (ray/scripts/scripts.py).
_DIED_HEADER = "Some Ray subprocesses exited unexpectedly"
_DIED = re.compile(r"-- (\w+) \[exit code=(-?\d+)\]")


def why_ray_ended(node_log: Path, tail: int = 1 << 16) -> str:
    """Which Ray daemons died, and how, as `ray start --block` wrote it into the node's log:
    'gcs_server killed by SIGKILL (...)'; '' when it did not say."""
    try:
        with node_log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            text = ANSI.sub("", f.read().decode(errors="replace"))
    except OSError:
        return ""
    at = text.rfind(_DIED_HEADER)
    if at < 0:
        return ""
    deaths = []
    for name, code in dict(_DIED.findall(text[at:])).items():  # (each daemon once)
        deaths.append(f"{name} {killed_by(int(code)) or f'exited with code {code}'}")
    hint = " (SIGKILL: most often the kernel's out-of-memory killer)" if "SIGKILL" in "".join(deaths) else ""
    return ", ".join(deaths) + hint


class RayProcess:
    """`ray start --block` and everything it spawned; stopped without touching other clusters."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        log.info("starting: %s", " ".join(argv))
        # NOTE: `ray start --block` dies with the node program, SIGKILL included (PDEATHSIG); its
        # own reaper (ray 2.60 services.start_reaper) then kills its process group: GCS, raylet,
        # dashboard and the workers. Without it a killed node program leaves Ray holding the
        # node's GPUs until the walltime, and the cluster looking alive.
        self.proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=die_with_parent)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """TERM `ray start`, then KILL every descendant left (we are their subreaper)."""
        import psutil

        me = psutil.Process()
        if self.alive():
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(me.children(recursive=True), timeout=5)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def become_subreaper() -> None:
    """Orphaned Ray daemons are re-parented to us, so teardown can find every one of them."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def tcp_open(ip: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False
