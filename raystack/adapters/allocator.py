"""Where an allocation comes from, behind one interface: SLURM (sbatch, squeue, scancel) or this
machine (`raystack up --local`: the node program started directly, no SLURM).

The backend is chosen once, from the `backend` field of the cluster record (or the node
program's context) and never guessed from the shape of an id. Model: submitit's Executor, with
its slurm/ and local/ implementations: each implementation lives beside the commands it wraps
(`slurm.SlurmAllocator`, `local.LocalAllocator`) and registers itself here (the package imports
both). Every answer is in SLURM's terms (`JobInfo`), so the rest of raystack judges both the
same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import ClassVar, Literal

from raystack.waiting import REAL, Clock

Backend = Literal["slurm", "local"]


class SlurmState(str, Enum):
    """An allocation's state in SLURM's words (base states, without flags), plus GONE and UNKNOWN;
    both backends answer in them (slurm.parse_state reads SLURM's text)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    GONE = "GONE"  # slurmctld says the id is invalid and accounting has no row for it
    UNKNOWN = "UNKNOWN"

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def is_active(self) -> bool:
        """The allocation holds (or may still get) its nodes."""
        return not self.is_terminal() and self is not SlurmState.UNKNOWN


_TERMINAL = {
    SlurmState.COMPLETED,
    SlurmState.CANCELLED,
    SlurmState.FAILED,
    SlurmState.TIMEOUT,
    SlurmState.NODE_FAIL,
    SlurmState.PREEMPTED,
    SlurmState.BOOT_FAIL,
    SlurmState.DEADLINE,
    SlurmState.OUT_OF_MEMORY,
    SlurmState.GONE,
}


@dataclass(frozen=True)
class JobInfo:
    """What raystack needs to know about one allocation (a SLURM job; a local one in its terms)."""

    job_id: str
    state: SlurmState
    reason: str = ""
    name: str = ""
    nodes: str = ""  # SLURM's compressed node list, e.g. "node[1-4]"
    node_count: int = 0
    start_time: int = 0  # epoch seconds, 0 when unknown
    end_time: int = 0  # epoch seconds: expected end while running, actual end once finished
    time_limit_s: int = 0  # 0 when unlimited or unknown
    exit_code: str = ""
    command: str = ""  # the script SLURM runs (squeue's %o), where it was asked for


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

    def restarts(self, alloc_id: str) -> int | None:
        """How often the backend has requeued the allocation (SLURM restarts a requeued job under
        its id; 0 where nothing requeues); None when it cannot say."""
        return 0

    def time_left(self, info: JobInfo | None) -> int | None:
        """Seconds to its walltime end while it runs; None without one (or not running)."""
        return None

    def where(self, alloc_id: str | None) -> str:
        return f"{self.label} {alloc_id}"


ALLOCATORS: dict[str, Allocator] = {}


def register(implementation: Allocator) -> Allocator:
    ALLOCATORS[implementation.backend] = implementation
    return implementation


def allocator(backend: str) -> Allocator:
    """The allocator of `backend` ('slurm' or 'local')."""
    try:
        return ALLOCATORS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(ALLOCATORS)}") from None


CONFIRM_GONE_AFTER = 1.0  # seconds between the two answers that make an allocation GONE


def ended(
    backend: str,
    alloc_id: str,
    info: JobInfo | None = None,
    clock: Clock = REAL,
) -> JobInfo | None:
    """The backend's final word on an allocation: what it says once the allocation has ended, None
    while it lives or the backend cannot be asked. `info` saves a query when the caller has one.
    GONE (slurmctld no longer knows the id and accounting has no row) is final only when said
    twice, a second apart, with nothing cached between."""
    asked = allocator(backend)
    info = info or asked.info(alloc_id)
    if info is None or not info.state.is_terminal():
        return None
    if info.state is SlurmState.GONE:
        clock.sleep(CONFIRM_GONE_AFTER)
        asked.forget(alloc_id)
        again = asked.info(alloc_id)
        if again is None or not again.state.is_terminal():
            return None
        info = again
    return info
