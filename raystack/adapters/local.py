"""Local allocations: the node program run directly on this machine, without SLURM.

`raystack up --local` starts the same node program SLURM would (a one-node cluster) from a
small launch script, detached from the terminal. Such an allocation is named
`local-<host>-<random>`; that id travels in the node program's environment as RAYSTACK_LOCAL_ID
and is how it is found again: a process of this user on this host whose command is the node
program and whose environment carries the id. Nothing is kept by pid, so a reused pid is never
taken for it. The rest of raystack asks about it through `LocalAllocator` (below) (chosen by
the record's `backend`, never by the id's shape).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

from raystack import __version__
from raystack.adapters.allocator import Allocator, AllocInfo, AllocState, NodeFacts, Request, Script, register
from raystack.errors import ConfigError
from raystack.store import files
from raystack.store.paths import NODE_LOG
from raystack.waiting import REAL, Clock, retry

PREFIX = "local-"
ENV_ID = "RAYSTACK_LOCAL_ID"
NODE_PROGRAM = b"raystack.allocation.node"
LAUNCHER = "raystack-local-launch"  # the launch script's argv[0], until it execs the node program


GPU_SOURCE = "CUDA_VISIBLE_DEVICES, else nvidia-smi -L"


def gpu_ids() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU nvidia-smi
    lists; [] without either."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity: a cgroup or taskset may give fewer)."""
    return len(os.sched_getaffinity(0))


def this_host() -> str:
    return socket.gethostname().split(".")[0]


def new_id() -> str:
    return f"{PREFIX}{this_host()}-{secrets.token_hex(4)}"


def host_of(alloc_id: str) -> str:
    return alloc_id[len(PREFIX) :].rsplit("-", 1)[0]


def pids(alloc_id: str, everything: bool = False) -> list[int] | None:
    """The node program's processes of this local allocation ([] when it has ended; with
    `everything`, every process that inherited its id: Ray's daemons, workers, jobs); None when
    it runs on another host, where this one cannot look."""
    if host_of(alloc_id) != this_host():
        return None
    needle = f"{ENV_ID}={alloc_id}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            # NOTE: a zombie's cmdline and environ read empty: an ended program is never found.
            cmdline = (proc / "cmdline").read_bytes()
            ours = everything or NODE_PROGRAM in cmdline or cmdline.startswith(LAUNCHER.encode() + b"\0")
            if ours and cmdline and needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def alive(alloc_id: str, confirm: int = 3, clock: Clock = REAL) -> bool | None:
    """Whether the node program runs. "No" is said only after `confirm` looks 0.2 s apart: while
    the launch script execs the node program, its command line reads empty for a moment."""

    def look(_attempt: int) -> tuple[bool | None] | None:
        found = pids(alloc_id)
        if found == []:
            return None  # (none seen: look again)
        return (None,) if found is None else (True,)  # (cannot tell / it runs)

    seen = retry(look, confirm, 0.2, clock)
    return False if seen is None else seen[0]


def start(alloc_id: str, script: Path, log: Path) -> None:
    """Run a launch script detached (its own session: the terminal may close), named `alloc_id`."""
    with open(log, "ab", opener=files.private) as out:
        subprocess.Popen(
            [LAUNCHER, str(script)],
            executable=shutil.which("bash") or "/bin/bash",
            env={**os.environ, ENV_ID: alloc_id},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def stop(alloc_id: str, sig: int = signal.SIGTERM) -> None:
    """Signal the node program (it stops its Ray processes and jobs itself); no-op once ended."""
    for pid in pids(alloc_id) or []:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def temp_prefix(alloc_id: str, scratch: Path) -> Path:
    """The start of the name of Ray's temp folder of a local allocation (allocation/node/context.py
    adds mkdtemp's random part): short, as Ray's Unix socket paths inside it are limited."""
    return scratch / f"rs-local-{alloc_id.rsplit('-', 1)[-1]}"


def scratch(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    return Path(env.get("RAYSTACK_LOCAL_SCRATCH") or "/tmp")


def sweep(alloc_id: str, ended: bool = False) -> list[int]:
    """Once the node program is gone: SIGKILL whatever it left (a SIGKILLed node program cannot
    stop its Ray; SLURM would kill the step's cgroup, here nothing else will) and remove Ray's
    temp folder it left (this user's only). The pids killed. `ended`: the caller just saw it gone."""
    if not ended and alive(alloc_id):
        return []
    left = pids(alloc_id, everything=True) or []
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    prefix = temp_prefix(alloc_id, scratch())
    for folder in prefix.parent.glob(f"{prefix.name}-*"):
        with contextlib.suppress(OSError):
            st = folder.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                shutil.rmtree(folder, ignore_errors=True)
    return left


def given_gpus(count: int) -> list[str]:
    """The ids of the first `count` GPUs this machine shows. Without a GPU to see (a login node,
    CI), `count` logical GPUs for Ray, as the testbed gives: placement and masking can be tested;
    CUDA cannot."""
    return gpu_ids()[:count] or [str(i) for i in range(count)]


def machine_counts(gpus: int | str, cpus: int | str | None) -> tuple[int, int]:
    """This machine's share a local cluster asks for ("auto" or None: all of it), checked."""
    ids, cores = gpu_ids(), cpu_count()
    if cpus not in (None, "auto") and not 1 <= int(cpus) <= cores:
        raise ConfigError(
            f"--cpus: {cpus} but this machine gives this process {cores} CPUs; use 1 to {cores}"
        )
    if gpus != "auto" and int(gpus) < 0:
        raise ConfigError(f"--gpus: {gpus} is negative; use 0 for a CPU-only cluster")
    if gpus != "auto" and ids and int(gpus) > len(ids):
        raise ConfigError(
            f"--gpus: {gpus} but this machine has {len(ids)} GPUs ({GPU_SOURCE}); use at most {len(ids)}"
        )
    return len(ids) if gpus == "auto" else int(gpus), cores if cpus in (None, "auto") else int(cpus)


LOCAL_ENDED = "the local node program is no longer running"


def render(script: Script) -> str:
    """The launch script of a local cluster (`raystack up --local`): the same profile setup and
    environment, then the node program itself as a one-node allocation on this machine."""
    request = script.request
    lines = [
        "#!/bin/bash",
        f"# Generated by raystack {__version__} (profile {script.profile}). It starts a one-node Ray",
        "# cluster on this machine, without SLURM (`raystack up --local`): the node program runs here",
        "# until `raystack down`. RAYSTACK_LOCAL_ID names this run; raystack finds the program by it.",
        "set -euo pipefail",
        "umask 077  # everything of the cluster is this user's only (node files, logs, sockets)",
        *script.environment,
        "",
        "# This machine's share: no SLURM to say it.",
        f"export RAYSTACK_LOCAL_GPUS={request.gpus_per_node} RAYSTACK_LOCAL_CPUS={request.cpus_per_node}",
    ]
    if request.gpus_per_node:
        lines.append(f"export CUDA_VISIBLE_DEVICES={','.join(given_gpus(request.gpus_per_node))}")
    lines += [
        "# A job must not think it runs inside a SLURM job (this shell may be inside one).",
        'for v in $(compgen -e | grep "^SLURM_" || true); do unset "$v"; done',
        'echo "raystack: local allocation $RAYSTACK_LOCAL_ID on $(hostname) (cluster $RAYSTACK_CLUSTER)"',
        'exec "$RAYSTACK_PYTHON" -m raystack.allocation.node',
        "",
    ]
    return "\n".join(lines)


class LocalAllocator(Allocator):
    """A one-node allocation on this machine; its id `local-<host>-<random>` names the host it
    runs on (only that host can ask about it)."""

    backend = "local"
    label = "on this machine as"
    remote = False
    walltime = False

    def submit(self, script: Path, request: Request) -> str:
        """The node program's output goes where a SLURM node's does: `node-<host>.log` beside the
        allocation logs `request.output` names."""
        assert request.output
        alloc_id = new_id()
        start(alloc_id, script, Path(request.output).parent / NODE_LOG.format(host=this_host()))
        return alloc_id

    def counts(self, gpus: int | str, cpus: int | str | None) -> tuple[int | str, int | str | None]:
        return machine_counts(gpus, cpus)

    def render(self, script: Script) -> str:
        return render(script)

    def facts(self, env: Mapping[str, str]) -> NodeFacts | None:
        alloc_id = env.get(ENV_ID)
        if not alloc_id:
            return None
        return NodeFacts(
            alloc_id=alloc_id,
            node_index=0,
            node_count=1,
            gpus=int(env.get("RAYSTACK_LOCAL_GPUS") or 0),
            cpus=int(env.get("RAYSTACK_LOCAL_CPUS") or cpu_count()),
            nodelist=this_host(),
            loopback=True,
            temp_name=temp_prefix(alloc_id, scratch(dict(env))).name,
        )

    def info(self, alloc_id: str) -> AllocInfo | None:
        """RUNNING while its node program lives, COMPLETED once it has gone (and what it left swept);
        None from another host (it cannot be asked)."""
        living = alive(alloc_id)
        if living is None:
            return None
        host = host_of(alloc_id)
        if living:
            return AllocInfo(alloc_id, AllocState.RUNNING, name="raystack-local", nodes=host, node_count=1)
        # NOTE: as SLURM ends every process of an allocation that ended, whatever its node program
        # left (it was SIGKILLed: an orphaned driver, Ray's daemons, the temp folder) goes as soon
        # as a command first sees it ended, not only at `raystack down`. (Never from inside it:
        # the node program does not count itself when it asks about its own allocation.)
        if os.environ.get(ENV_ID) != alloc_id:
            sweep(alloc_id, ended=True)
        return AllocInfo(alloc_id, AllocState.ENDED, reason=LOCAL_ENDED, nodes=host, node_count=1)

    def cancel(self, alloc_id: str) -> None:
        stop(alloc_id)

    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        return [this_host()]

    def sweep(self, alloc_id: str) -> list[int]:
        return sweep(alloc_id)

    def why_ended(self, info: AllocInfo) -> tuple[str, str]:
        if info.reason == LOCAL_ENDED:
            return "failed", f"{LOCAL_ENDED} (killed, or the machine restarted)"
        return "scancel", "the local node program was sent a signal"


register(LocalAllocator())
