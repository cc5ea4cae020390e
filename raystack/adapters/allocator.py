"""Where an allocation comes from, behind one interface any scheduler can sit behind: SLURM
(adapters/slurm/: sbatch, squeue, scontrol, scancel) or this machine (adapters/local.py:
`raystack up --local`, the node program started directly).

The rest of raystack speaks only this module's words: a `Request` (nodes, GPUs and CPUs per node,
memory, time, queue, account, QoS, ... and the scheduler's own options the user added) goes in;
an `AllocInfo` (id, `AllocState`, nodes, times, the scheduler's own state word and reason) comes
out. The adapter alone turns a Request into its commands and dependency strings, renders its
allocation script around the environment raystack gives it, and reads a node program's facts
(`NodeFacts`: which allocation, which node, how many) from the environment its scheduler sets.

The backend is chosen once, from the `backend` field of the cluster record (or the node
program's context) and never guessed from the shape of an id. Model: submitit's Executor, with
its slurm/ and local/ implementations: each implementation lives beside the commands it wraps
and registers itself here (the package imports them). A new backend's files are listed in
docs/development.md ("A new scheduler").
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import ClassVar

from raystack.errors import ConfigError
from raystack.store.cluster import ClusterRecord
from raystack.waiting import REAL, Clock


class AllocState(str, Enum):
    """An allocation's state in raystack's words; `AllocInfo.native` keeps the scheduler's."""

    WAITING = "WAITING"  # queued: the scheduler has not given it nodes yet (or requeued it)
    STARTING = "STARTING"  # nodes given, being set up (SLURM's CONFIGURING, a node booting)
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    ENDING = "ENDING"  # its processes are being ended (SLURM's COMPLETING)
    ENDED = "ENDED"  # over, however it ended (`native` and `reason` say how)
    GONE = "GONE"  # the scheduler no longer knows the id at all
    UNKNOWN = "UNKNOWN"  # an answer raystack cannot read

    def is_terminal(self) -> bool:
        return self in (AllocState.ENDED, AllocState.GONE)

    def is_active(self) -> bool:
        """The allocation holds (or may still get) its nodes."""
        return not self.is_terminal() and self is not AllocState.UNKNOWN


@dataclass(frozen=True)
class AllocInfo:
    """What raystack needs to know about one allocation."""

    alloc_id: str
    state: AllocState
    reason: str = ""  # the scheduler's reason (why it waits, why it ended), as it says it
    name: str = ""
    nodes: str = ""  # the scheduler's node list, e.g. SLURM's "node[1-4]"
    node_count: int = 0
    start_time: int = 0  # epoch seconds, 0 when unknown
    end_time: int = 0  # epoch seconds: expected end while running, actual end once finished
    time_limit_s: int = 0  # 0 when unlimited or unknown
    exit_code: str = ""
    command: str = ""  # the script it runs, where it was asked for (which cluster folder)
    native: str = ""  # the scheduler's own state word: "TIMEOUT", "NODE_FAIL", "PENDING"

    @property
    def state_text(self) -> str:
        """Its state as a person is told it: the scheduler's word where it has one."""
        return self.native or self.state.value


@dataclass(frozen=True)
class Request:
    """One allocation as raystack asks for it, in no scheduler's words (the adapter translates).
    None: the scheduler's (or the script's) default."""

    name: str  # what the scheduler lists it as: raystack-<cluster>
    nodes: int | None = None
    gpus_per_node: int = 0
    gpu_type: str | None = None
    cpus_per_node: int | None = None  # CPUs of the one task per node
    memory: str | None = None  # per node, in sbatch --mem's units ("0": all of it)
    time: str | None = None  # the walltime, as given (SLURM's time forms: 2:00:00, 1-0, 90)
    queue: str | None = None  # SLURM's partition, PBS's queue
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None  # node features, e.g. "a100|h100"
    reservation: str | None = None
    gres: str | None = None  # further generic resources beyond the GPUs, e.g. nvme:1
    exclusive: bool = False
    output: str | None = None  # where the script's output goes ("%j": the allocation's id)
    warn_before: int = 0  # seconds before the walltime end at which the script is warned (USR1)
    after: str | None = None  # start only once this allocation has ended (a chain's next link)
    exclude: tuple[str, ...] = ()  # hosts it must not get (a grown allocation: the cluster's own)
    native: tuple[str, ...] = ()  # further options in the scheduler's own words (extra_sbatch)

    def dump(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @classmethod
    def load(cls, data: Mapping[str, object]) -> Request:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for listed in ("native", "exclude"):  # (JSON keeps them as lists)
            known[listed] = tuple(known.get(listed) or ())  # type: ignore[arg-type]
        return cls(**known)  # type: ignore[arg-type]


def asked(record: ClusterRecord) -> Request | None:
    """What a cluster's allocations ask for (None: a hand-submitted script's, unknown). A record
    written before requests were neutral kept sbatch's options: asked for as they were."""
    if record.request:
        return Request.load(record.request)
    legacy = (record.model_extra or {}).get("sbatch_options")
    if not legacy:
        return None
    native = tuple(o for o in legacy if not o.startswith(("--job-name", "--dependency")))
    return Request(name=f"raystack-{record.name}", native=native)


@dataclass(frozen=True)
class NodeFacts:
    """What a node program learns from its scheduler's environment."""

    alloc_id: str
    node_index: int  # 0: the allocation's first node (the head, in a cluster's first allocation)
    node_count: int
    gpus: int  # GPUs this node was given
    cpus: int  # CPUs this node's task was given
    restart: int = 0  # which run of the allocation (a requeued one runs again under its id)
    nodelist: str = ""  # every node, in the scheduler's words (hosts() expands it)
    cpus_per_node: list[int] = field(default_factory=list)  # each node's CPUs, where said
    loopback: bool = False  # one machine, nothing reachable from elsewhere (binds 127.0.0.1)
    temp_name: str = ""  # the start of Ray's temp folder's name, where the adapter sweeps by it


@dataclass(frozen=True)
class NodeShape:
    """CPUs and GPUs every node of a queue has (the smallest node where they differ)."""

    partition: str
    cpus: int
    gpus: int
    nodes: int
    uniform: bool
    mem_mb: int | None = None  # memory per node (the smallest), where the scheduler lists it
    features: frozenset[str] | None = None  # every feature of a node of it (constraints), where listed


@dataclass(frozen=True)
class Script:
    """What an adapter's allocation script is built from: raystack gives, the adapter renders."""

    request: Request
    environment: list[str]  # shell lines: the cluster folder, the profile's setup and env
    profile: str  # the profile's name (the script says what generated it)
    note: str = ""  # what was decided and why (whole nodes, a shorter warning lead)
    path: Path | None = None  # where the script is written (None: the hand-submitted template)


class Allocator(ABC):
    """Submit, ask about, end and release one backend's allocations."""

    backend: ClassVar[str]
    label: ClassVar[str]  # how a person is told where it runs: "SLURM job 12"
    remote: ClassVar[bool]  # its nodes are other hosts than the one that submitted it
    command: ClassVar[str] = ""  # its submit command as a person types it ("sbatch")
    own_env: ClassVar[tuple[str, ...]] = ()  # prefixes of the variables it gives an allocation
    walltime: ClassVar[bool] = True  # its allocations end at a time limit (a time is asked for)

    @abstractmethod
    def submit(self, script: Path, request: Request) -> str:
        """Start the allocation script as `request` asks; its id. The scheduler's refusal is raised
        (SchedulerError and its kinds)."""

    @abstractmethod
    def info(self, alloc_id: str) -> AllocInfo | None:
        """Its state; None when the backend cannot be asked (never a guess)."""

    @abstractmethod
    def cancel(self, alloc_id: str) -> None:
        """End it (from outside); ending one that has ended is not an error."""

    @abstractmethod
    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        """Its nodes' host names, head first."""

    @abstractmethod
    def why_ended(self, info: AllocInfo) -> tuple[str, str]:
        """(kind, text) of an ended allocation as walltime.py's table names them."""

    @abstractmethod
    def render(self, script: Script) -> str:
        """The allocation script: `script.environment`, then one node program per node."""

    def counts(self, gpus: int | str, cpus: int | str | None) -> tuple[int | str, int | str | None]:
        """The GPUs and CPUs per node a plan asks for, where the backend decides them itself (one
        machine: its own, checked); as given elsewhere ("auto": the scheduler's whole node)."""
        return gpus, cpus

    def never_starts(self, info: AllocInfo) -> tuple[str, str] | None:
        """(what it means, what to change) where the scheduler holds the allocation back for a
        reason no amount of waiting clears (a limit per job, an account that is not valid)."""
        return None

    def waits_for_nodes_out(self, info: AllocInfo) -> bool:
        """Whether it waits for nodes that are down or drained (then `nodes_out` says which)."""
        return False

    def check_native(self, option: str, source: str = "", profile: bool = False) -> str:
        """One option in the scheduler's own words (`up --sbatch`, a profile's `extra_sbatch`), as
        it will be given: a ConfigError naming the fix where the scheduler has no such option or
        raystack sets it itself. A backend without options of its own refuses every one."""
        raise ConfigError(
            f"{source or 'option'} {option!r}: the {self.backend} backend takes no options of its own"
        )

    @abstractmethod
    def facts(self, env: Mapping[str, str]) -> NodeFacts | None:
        """A node program's facts from its environment; None when this backend did not start it."""

    def argv(self, script: Path, request: Request) -> list[str]:
        """The command a person could type to submit it (`up --dry-run`); [] where there is none."""
        return []

    def named(self, name: str) -> list[AllocInfo]:
        """This user's allocations called `name` the backend knows, each with its `command`."""
        return []

    def node_shape(self, queue: str | None) -> NodeShape | None:
        """The size of a queue's nodes (None: the backend cannot say)."""
        return None

    def time_limit(self, queue: str | None) -> tuple[str, int | None] | None:
        """(the queue, its time limit in seconds or None when unlimited); None: cannot say."""
        return None

    def nodes_out(self, queue: str | None) -> tuple[int, dict[str, str]] | None:
        """How many of a queue's nodes can run jobs now, and those that cannot (node -> why);
        None: the backend cannot say."""
        return None

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

    def time_left(self, info: AllocInfo | None) -> int | None:
        """Seconds to its walltime end while it runs; None without one (or not running)."""
        return None

    def place(self, alloc_id: str | None) -> str:
        return f"{self.label} {alloc_id}"


ALLOCATORS: dict[str, Allocator] = {}
PLUGINS = "raystack.backends"  # the entry-point group a backend of another package registers in


def register(implementation: Allocator) -> Allocator:
    ALLOCATORS[implementation.backend] = implementation
    return implementation


def plugins() -> dict[str, Allocator]:
    """Every backend: raystack's own and those other packages name in the `raystack.backends`
    entry-point group (each entry a module that calls `register` when imported). Read once, and
    only where a backend is asked for by name or a node program looks for its own."""
    _load_plugins()
    return ALLOCATORS


@functools.cache
def _load_plugins() -> None:
    for entry in metadata.entry_points(group=PLUGINS):
        entry.load()


def allocator(backend: str) -> Allocator:
    """The allocator of `backend` ('slurm', 'local', or a plug-in's)."""
    found = ALLOCATORS.get(backend) or plugins().get(backend)
    if found is None:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(ALLOCATORS)}")
    return found


def node_facts(env: Mapping[str, str]) -> tuple[str, NodeFacts]:
    """(backend, facts) of the node program this environment started; the one-machine backends
    first (their shell may run inside a SLURM job), a plug-in's before raystack's remote ones."""
    order = {name: (a.remote, name == "slurm") for name, a in plugins().items()}
    for name in sorted(ALLOCATORS, key=order.__getitem__):
        if (found := ALLOCATORS[name].facts(env)) is not None:
            return name, found
    raise ValueError(
        f"no backend ({', '.join(ALLOCATORS)}) started this node program: no allocation id in its environment"
    )


CONFIRM_GONE_AFTER = 1.0  # seconds between the two answers that make an allocation GONE


def ended(
    backend: str,
    alloc_id: str,
    info: AllocInfo | None = None,
    clock: Clock = REAL,
) -> AllocInfo | None:
    """The backend's final word on an allocation: what it says once the allocation has ended, None
    while it lives or the backend cannot be asked. `info` saves a query when the caller has one.
    GONE (the scheduler no longer knows the id, nor its accounting) is final only when said
    twice, a second apart, with nothing cached between."""
    asked = allocator(backend)
    info = info or asked.info(alloc_id)
    if info is None or not info.state.is_terminal():
        return None
    if info.state is AllocState.GONE:
        clock.sleep(CONFIRM_GONE_AFTER)
        asked.forget(alloc_id)
        again = asked.info(alloc_id)
        if again is None or not again.state.is_terminal():
            return None
        info = again
    return info
