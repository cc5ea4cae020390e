"""Where an allocation comes from, behind one interface: SLURM (sbatch, squeue, scancel) or this
machine (`raystack up --local`: the node program started directly, no SLURM).

The backend is chosen once, from the `backend` field of the cluster record (or the node
program's context) and never guessed from the shape of an id. Model: submitit's Executor, with
its slurm/ and local/ implementations. Every answer is in SLURM's terms (`JobInfo`), so the rest
of raystack judges both the same way.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar, Literal

from raystack.adapters import local, slurm
from raystack.adapters.slurm import JobInfo, SlurmState

Backend = Literal["slurm", "local"]
LOCAL_ENDED = "the local node program is no longer running"


class Allocator(ABC):
    """Submit, ask about, end and release one backend's allocations."""

    backend: ClassVar[Backend]
    label: ClassVar[str]  # how a person is told where it runs: "SLURM job 12"
    remote: ClassVar[bool]  # its nodes are other hosts than the one that submitted it

    @abstractmethod
    def submit(self, script: Path, options: Sequence[str], log: Path) -> str:
        """Start the allocation script; its id. `options`: sbatch's; `log`: where a backend
        without SLURM's --output writes the script's output."""

    @abstractmethod
    def info(self, alloc_id: str) -> JobInfo | None:
        """Its state in SLURM's terms; None when the backend cannot be asked (never a guess)."""

    @abstractmethod
    def cancel(self, alloc_id: str) -> None:
        """End it (from outside); ending one that has ended is not an error."""

    @abstractmethod
    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        """Its nodes' host names, head first."""

    @abstractmethod
    def why_ended(self, info: JobInfo) -> tuple[str, str]:
        """(kind, text) of an ended allocation as walltime.py's table names them."""

    def release(self, alloc_id: str) -> None:
        """Called from inside the allocation by a node program that ends it: SLURM must be told
        (scancel); a local allocation ends when its node program exits."""
        return None

    def forget(self, alloc_id: str | None = None) -> None:
        """Drop cached answers (all, or one allocation's)."""
        return None

    def sweep(self, alloc_id: str) -> list[int]:
        """Once it has ended: kill what it left on this machine (pids); SLURM's cgroups do that."""
        return []

    def time_left(self, info: JobInfo | None) -> int | None:
        """Seconds to its walltime end while it runs; None without one (or not running)."""
        if info is None or info.state is not SlurmState.RUNNING or not info.end_time:
            return None
        return max(0, int(info.end_time - time.time()))

    def where(self, alloc_id: str | None) -> str:
        return f"{self.label} {alloc_id}"


class SlurmAllocator(Allocator):
    """Answers are kept for slurm.CACHE_TTL: one command asks SLURM once per allocation. When an
    ask found SLURM not answering (squeue gave up after its own timeout, SLOW_FAILURE or more),
    nobody here asks again for QUIET seconds: "unknown" at once, not another wait as long."""

    backend = "slurm"
    label = "SLURM job"
    remote = True
    SLOW_FAILURE = 5.0
    QUIET = 30.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache: dict[str, tuple[float, JobInfo | None]] = {}
        self.clock = clock
        self.quiet_until = 0.0

    def submit(self, script: Path, options: Sequence[str], log: Path) -> str:
        return slurm.sbatch(options, str(script))

    def info(self, alloc_id: str) -> JobInfo | None:
        cached = self.cache.get(alloc_id)
        if cached and self.clock() - cached[0] < slurm.CACHE_TTL:
            return cached[1]
        if self.clock() < self.quiet_until:
            return None
        asked = self.clock()
        info = slurm.job_info(alloc_id)
        if info is None and self.clock() - asked >= self.SLOW_FAILURE:
            self.quiet_until = self.clock() + self.QUIET
        self.cache[alloc_id] = (self.clock(), info)
        return info

    def cancel(self, alloc_id: str) -> None:
        self.forget(alloc_id)
        slurm.scancel(alloc_id)

    def release(self, alloc_id: str) -> None:
        self.cancel(alloc_id)

    def forget(self, alloc_id: str | None = None) -> None:
        if alloc_id is None:
            self.cache.clear()
        else:
            self.cache.pop(alloc_id, None)

    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        return slurm.hostnames(nodelist)

    def why_ended(self, info: JobInfo) -> tuple[str, str]:
        reason = (info.reason or "").lower()
        if "timelimit" in reason or info.state is SlurmState.TIMEOUT:
            return "walltime", "walltime"
        if "node" in reason or info.state is SlurmState.NODE_FAIL:
            return "node lost", f"node failure ({info.reason or info.state.value})"
        if "preempt" in reason or info.state is SlurmState.PREEMPTED:
            return "preempted", "preempted"
        return "scancel", "cancelled by scancel or an administrator"


class LocalAllocator(Allocator):
    """A one-node allocation on this machine; its id `local-<host>-<random>` names the host it
    runs on (only that host can ask about it)."""

    backend = "local"
    label = "on this machine as"
    remote = False

    def submit(self, script: Path, options: Sequence[str], log: Path) -> str:
        alloc_id = local.new_id()
        local.start(alloc_id, script, log)
        return alloc_id

    def info(self, alloc_id: str) -> JobInfo | None:
        """RUNNING while its node program lives, COMPLETED once it has gone; None from another
        host (it cannot be asked)."""
        alive = local.alive(alloc_id)
        if alive is None:
            return None
        host = local.host_of(alloc_id)
        if alive:
            return JobInfo(alloc_id, SlurmState.RUNNING, name="raystack-local", nodes=host, node_count=1)
        return JobInfo(alloc_id, SlurmState.COMPLETED, reason=LOCAL_ENDED, nodes=host, node_count=1)

    def cancel(self, alloc_id: str) -> None:
        local.stop(alloc_id)

    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        return [local.this_host()]

    def sweep(self, alloc_id: str) -> list[int]:
        return local.sweep(alloc_id)

    def why_ended(self, info: JobInfo) -> tuple[str, str]:
        if info.reason == LOCAL_ENDED:
            return "failed", f"{LOCAL_ENDED} (killed, or the machine restarted)"
        return "scancel", "the local node program was sent a signal"


ALLOCATORS: dict[str, Allocator] = {a.backend: a for a in (SlurmAllocator(), LocalAllocator())}


def allocator(backend: str) -> Allocator:
    """The allocator of `backend` ('slurm' or 'local')."""
    try:
        return ALLOCATORS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(ALLOCATORS)}") from None
