"""The cluster record (cluster.json), the token and the node entries of one cluster folder."""

from __future__ import annotations

import difflib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raystack.errors import ClusterError, NoSuchCluster
from raystack.store import paths
from raystack.store.files import atomic_write, locked, make_private_dirs, read_dict
from raystack.store.paths import ClusterPaths

log = logging.getLogger("raystack")


class ClusterState(str, Enum):
    """The Ray cluster's state (never SLURM's: see adapters.allocator.AllocState)."""

    SUBMITTED = "SUBMITTED"  # sbatch accepted it (or the chain's next allocation): may be pending
    STARTING = "STARTING"  # the allocation runs; Ray is coming up
    READY = "READY"  # every node, GPU and CPU registered and the Jobs API answers
    STOPPING = "STOPPING"  # `down` asked for it
    STOPPED = "STOPPED"  # ended by `down` or by the allocation's own end
    FAILED = "FAILED"  # could not start, or died

    @classmethod
    def _missing_(cls, value: object) -> ClusterState | None:
        return unknown_member(cls, value)

    @property
    def known(self) -> bool:
        """False for a state written by another version of raystack (kept and shown as it is)."""
        return self._name_ in type(self).__members__

    def is_terminal(self) -> bool:
        return self in (ClusterState.STOPPED, ClusterState.FAILED)


class EndKind(str, Enum):
    """How an allocation ends: the record's `ending` while it ends, and the kind of every
    recorded end (raystack/walltime.py's table says what follows each)."""

    WALLTIME = "walltime"  # the USR1 warning, the time limit
    NODE_LOST = "node lost"
    PREEMPTED = "preempted"
    DOWN = "down"  # raystack down
    IDLE = "idle"  # idle autostop
    CANCELLED = "scancel"  # cancelled by hand or an administrator
    CRASHED = "crashed"  # the head's node program could not go on, or Ray's head died under it
    HEAD_LOST = "head lost"  # a worker found the head's node program gone
    REQUEUED = "requeued"  # SLURM requeued it (scontrol requeue, a requeueing preemption): it runs again
    FAILED = "failed"  # Ray or a node failed to start

    @classmethod
    def _missing_(cls, value: object) -> EndKind | None:
        return unknown_member(cls, value)


E = TypeVar("E", bound=Enum)


def unknown_member(cls: type[E], value: object) -> E | None:
    """A state another version of raystack wrote (a login node's venv upgraded while a cluster
    runs): kept as a member of its own, with its text, so the record stays readable and is
    written back unchanged; `known` is False for it and it is never terminal."""
    if not isinstance(value, str) or not value or len(value) > 40:
        return None
    member = str.__new__(cls, value)  # type: ignore[type-var]
    member._value_, member._name_ = value, value
    return member


SCHEMA = 2  # 1: slurm_job_id/next_job_id, a local allocation told by its id's "local-" prefix
SCHEMA_1_ENDINGS = {"walltime warning": "walltime", "raystack down": "down"}  # (the rest are the same)


class Allocation(BaseModel):
    """One allocation the cluster ran on (kept across the chain, for `report` and pruning)."""

    model_config = ConfigDict(extra="allow")

    alloc_id: str
    index: int = 1  # its place in the chain
    nodes: int | None = None
    started: float | None = None
    ready: float | None = None
    ended: float | None = None
    reason: str | None = None


GROW_VAR = "RAYSTACK_GROW"  # set by a grown allocation's script: its nodes join the cluster as workers


class Grown(BaseModel):
    """A further allocation whose nodes joined the cluster as Ray workers (`raystack grow`)."""

    model_config = ConfigDict(extra="allow")

    alloc_id: str
    nodes: int
    gpus_per_node: int = 0
    cpus_per_node: int = 0
    queue: str | None = None  # its partition, where it is not the head's
    submitted: float = Field(default_factory=time.time)
    hosts: list[str] = Field(default_factory=list)  # its nodes, once they run
    walltime_end: int | None = None  # epoch seconds, once it runs
    leaving: str | None = None  # why it is being released (shrink): drained, then ended
    deadline: float = 60.0  # seconds its drain may wait for the work on its nodes
    drained: float | None = None  # epoch seconds: Ray's GCS took its nodes' drain
    released: float | None = None  # epoch seconds: its nodes were told to leave
    auto: bool = False  # submitted by the queue (`up --max-nodes`): released when idle


class ClusterRecord(BaseModel):
    """cluster.json: everything a client needs to find and judge a cluster."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)  # (another version's fields kept)

    schema_version: int = SCHEMA
    name: str
    state: ClusterState = ClusterState.SUBMITTED
    message: str = ""
    profile: str = "generic"
    backend: str = "slurm"  # the scheduler allocations come from (adapters/allocator.py)
    allocation_id: str | None = None  # SLURM's job id, or a local allocation's own id
    submitter: str | None = None  # host:pid of the `raystack up` that wrote the first record
    allocation_restart: int = 0  # which run of it holds the cluster (SLURM restarts a requeued job)
    nodes_expected: int = 0
    gpus_per_node: int = 0
    cpus_per_node: int = 0
    memory_per_node: int = 0  # bytes of Ray's `memory` resource on the smallest node (0: not known)
    nodes: list[str] = Field(default_factory=list)  # host names, head first
    nodes_joined: int = 0
    head_host: str | None = None
    head_ip: str | None = None
    ports: dict[str, int] = Field(default_factory=dict)
    gcs_address: str | None = None
    dashboard_url: str | None = None  # https:// on a TLS cluster
    tls: bool = False  # mutual TLS between Ray's processes (profile `tls: true`, `up --tls`)
    walltime_end: int | None = None  # epoch seconds
    walltime: float | None = None  # seconds each allocation is given (--time); None: no limit
    ray_version: str | None = None
    runner_pid: int | None = None  # the queue runner on the head
    runner_wake: str | None = None  # its named pipe (node-local: a submit there writes to it)
    runner_restarts: int = 0
    # A chain of allocations: one cluster (and queue) across walltimes.
    chain_count: int = 1  # allocations in all (raystack up --chain K)
    chain_index: int = 1  # which of them runs (or is pending) now
    signal_lead: int = 600  # seconds before the walltime at which SLURM warns (USR1)
    request: dict[str, Any] | None = None  # what the allocation asked (allocator.Request): the follow-on too
    next_allocation_id: str | None = None  # the follow-on allocation, pending on this one (afterany)
    ending: EndKind | None = None  # how the current allocation is ending, once that is known
    chain_ended: str | None = None  # why no further allocation follows, once one of them ended it
    allocations: list[Allocation] = Field(default_factory=list)  # one entry per allocation run
    grown: list[Grown] = Field(default_factory=list)  # further allocations of workers (`raystack grow`)
    max_nodes: int | None = None  # the queue grows the cluster up to this many nodes (`up --max-nodes`)
    scaling: str | None = None  # what growing it waits for now (allocation/elastic/autoscale.py)
    # How messages name it; `raystack check --profile` judges a job against the cluster a profile
    # would make, which is no cluster of its own name. Never written.
    described: str | None = Field(default=None, exclude=True)
    idle_timeout: float | None = None  # seconds idle after which the head ends the cluster
    idle_since: float | None = None  # epoch seconds: idle since then (None: busy, or not READY)
    prometheus: str | None = None  # the head's Prometheus as the head reaches it (metrics on)
    canary: dict[str, Any] | None = None  # the interconnect canary at READY (allocation/head/canary.py)
    created: float = Field(default_factory=time.time)
    updated: float = Field(default_factory=time.time)
    history: list[dict[str, Any]] = Field(default_factory=list)  # state changes with times

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """A record of schema 1 (written before backends) read as schema 2."""
        if not isinstance(data, dict) or data.get("schema_version", 1) >= SCHEMA:
            return data
        data = dict(data)
        for old, new in (("slurm_job_id", "allocation_id"), ("next_job_id", "next_allocation_id")):
            if old in data:
                data.setdefault(new, data.pop(old))
        if str(data.get("allocation_id") or "").startswith("local-"):  # schema 1's only mark
            data.setdefault("backend", "local")
        if data.get("ending") in SCHEMA_1_ENDINGS:
            data["ending"] = SCHEMA_1_ENDINGS[data["ending"]]
        data["allocations"] = [
            {"alloc_id": a.pop("job_id"), **a} if isinstance(a, dict) and "job_id" in a else a
            for a in (dict(a) if isinstance(a, dict) else a for a in data.get("allocations") or [])
        ]
        data["schema_version"] = SCHEMA
        return data

    @property
    def held(self) -> tuple[int, int, int]:
        """(nodes, GPUs and CPUs per node) jobs may count on: the head allocation's and staying grown
        ones of its shape. A head without GPUs (a CPU partition) counts the grown GPU nodes of the
        first such shape instead (drivers run on the head). Other nodes are Ray's, not counted."""
        gpu = self.gpu_grown
        shape = gpu or self
        same = sum(g.nodes for g in self.grown if not g.leaving and g.gpus_per_node == shape.gpus_per_node)
        return (0 if gpu else self.nodes_expected) + same, shape.gpus_per_node, shape.cpus_per_node

    @property
    def gpu_grown(self) -> Grown | None:
        """For a head without GPUs: the first staying grown allocation with GPUs (its shape counts)."""
        return (
            None
            if self.gpus_per_node
            else next((g for g in self.grown if not g.leaving and g.gpus_per_node), None)
        )

    @property
    def nodes_held(self) -> int:
        return self.held[0]

    def grown_entry(self, alloc_id: str) -> Grown | None:
        return next((g for g in self.grown if g.alloc_id == alloc_id), None)

    @property
    def title(self) -> str:
        """The cluster as a message names it: cluster 'grpo' (or what `described` says)."""
        return self.described or f"cluster '{self.name}'"

    @property
    def on_head_dashboard_url(self) -> str | None:
        """The dashboard as the head node's own programs reach it: on a TLS cluster Ray's plain
        HTTP on 127.0.0.1 (the token never leaves the host), else the public address."""
        inner = self.ports.get("dashboard_http")
        return f"http://127.0.0.1:{inner}" if self.tls and inner else self.dashboard_url


def exists(name: str) -> bool:
    return paths.cluster(name).record.is_file()


def list_names() -> list[str]:
    base = paths.clusters_dir()
    if not base.is_dir():
        return []
    return sorted(
        p.name for p in base.iterdir() if paths.NAME.fullmatch(p.name) and (p / paths.RECORD).is_file()
    )


class UnreadableRecord(ClusterError):
    """cluster.json exists but cannot be read now. It is never moved: the head and the runner
    read it too, and a record moved aside would end the cluster."""


def _last_allocation(p: paths.ClusterPaths) -> str:
    """' (its newest allocation: N)', from the allocation logs in the folder ('' if none)."""
    head, _, tail = paths.ALLOCATION_LOG.partition("{job}")
    try:  # (a log pruned meanwhile: nothing to say rather than another error)
        logs = sorted(p.logs.glob(f"{head}*{tail}"), key=lambda f: f.stat().st_mtime)
    except OSError:
        return ""
    alloc = logs[-1].name.removeprefix(head).removesuffix(tail) if logs else ""
    return f" (its newest allocation: {alloc})" if alloc else ""


def read(name: str) -> ClusterRecord:
    """The record of cluster `name`. Raises ClusterError when there is none, UnreadableRecord
    when it cannot be read (the file is left where it is)."""
    p = paths.cluster(name)
    try:
        return ClusterRecord.model_validate_json(p.record.read_bytes())
    except FileNotFoundError:
        pass
    except (ValidationError, ValueError, OSError) as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        raise UnreadableRecord(
            f"the record of cluster '{name}' cannot be read ({why}); it is left at {p.record}: "
            f"repair it (it is JSON), or end the cluster by hand{_last_allocation(p)} and remove {p.root}"
        ) from None
    names = list_names()
    known = ", ".join(names) or "none"
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)  # (a typo: bsy for busy)
    if near:
        raise NoSuchCluster(
            f"no cluster named '{name}' in {paths.clusters_dir()}: did you mean '{near[0]}'? "
            f"(known: {known}; a new one: `raystack up --name {name}`)"
        )
    raise NoSuchCluster(
        f"no cluster named '{name}' in {paths.clusters_dir()} (known: {known}); start one with "
        f"`raystack up --name {name}`"
    )


def read_all() -> list[ClusterRecord]:
    """Every readable record (an unreadable one is reported with a warning and skipped)."""
    records = []
    for name in list_names():
        try:
            records.append(read(name))
        except ClusterError as exc:
            log.warning("raystack: warning: %s", exc)
    return records


def write(record: ClusterRecord) -> None:
    record.updated = time.time()
    atomic_write(paths.cluster(record.name).record, record.model_dump_json(indent=2), mode=0o600)


def update(name: str, **changes: Any) -> ClusterRecord:
    """Read-modify-write under the lock; a state change is appended to the history."""
    with locked(paths.cluster(name)):
        record = read(name) if exists(name) else ClusterRecord(name=name)
        apply_changes(record, changes)
        write(record)
        return record


def apply_changes(record: Any, changes: dict[str, Any]) -> None:
    """Set fields of a record with a `state` and a `history`; a state change is appended to the
    history with its time (`at`, default now) and message. Shared by cluster and job records."""
    at = changes.pop("at", None)
    state = changes.get("state")
    if state is not None and state != record.state:
        record.history.append(
            {
                "state": type(record.state)(state).value,
                "time": at or time.time(),
                "message": changes.get("message", ""),
            }
        )
    for key, value in changes.items():
        setattr(record, key, value)


def note_allocation(record: ClusterRecord, alloc_id: str, **fields: Any) -> None:
    """Add to (or update) the record's entry for allocation `alloc_id` (kept across the chain)."""
    entry = next((a for a in record.allocations if a.alloc_id == alloc_id), None)
    if entry is None:
        entry = Allocation(alloc_id=alloc_id, index=record.chain_index)
        record.allocations = [*record.allocations, entry]
    for key, value in fields.items():
        setattr(entry, key, value)


def note_grown(name: str, alloc_id: str, **fields: Any) -> Grown | None:
    """Add (with `nodes`) or update the entry of a grown allocation, under the lock; None when the
    record has no such entry and none is made."""
    with locked(paths.cluster(name)):
        record = read(name)
        entry = record.grown_entry(alloc_id)
        if entry is None:
            if "nodes" not in fields:
                return None
            entry = Grown(alloc_id=alloc_id, **fields)
            record.grown = [*record.grown, entry]
        else:
            for key, value in fields.items():
                setattr(entry, key, value)
            record.grown = list(record.grown)
        write(record)
        return entry


def note(name: str, alloc_id: str, **fields: Any) -> ClusterRecord:
    """`note_allocation` as one locked read-modify-write of the record."""
    with locked(paths.cluster(name)):
        record = read(name)
        note_allocation(record, alloc_id, **fields)
        write(record)
        return record


def check_open(name: str) -> ClusterRecord | None:
    """Refuse a job for a cluster that is going down (`down`, idle autostop) or has ended; the
    record that let it in (None: no cluster of that name yet), whose `ending_note` says what
    becomes of the job where the allocation is ending. `enqueue` asks under the cluster lock, so
    an autostop deciding meanwhile cannot strand it, and what a submit is told comes from the same
    read that let its job in."""
    try:
        record = read(name)
    except NoSuchCluster:
        return None
    if record.state is ClusterState.STOPPING or record.state.is_terminal():
        why = f" ({record.message})" if record.message else ""
        raise ClusterError(
            f"cluster {name} is {record.state.value}{why}: start it again with `{up_again(record)}`, "
            "then submit"
        )
    return record


def up_again(record: ClusterRecord) -> str:
    """The command that starts a cluster of this name again, the way it was made (a local one with
    --local: typed without it, it would go to SLURM)."""
    return f"raystack up --name {record.name}{' --local' if record.backend == 'local' else ''} ..."


def ending_note(record: ClusterRecord) -> str | None:
    """Why nothing starts in a cluster whose allocation is ending (walltime warning, a lost node
    with a follow-on), and where a queued job will run instead; None otherwise."""
    if record.ending is None or record.state.is_terminal():
        return None
    if record.next_allocation_id and not record.chain_ended:
        then = f"queued jobs start in the next one ({record.next_allocation_id}, pending)"
    else:
        then = f"no allocation follows: `{up_again(record)}` runs the queue again"
    which = f"allocation {record.allocation_id}" if record.allocation_id else "the allocation"
    return f"{which} is ending ({record.ending.value}): nothing more starts in it; {then}"


def find(name: str | None, ended: Callable[[ClusterRecord], bool] | None = None) -> ClusterRecord:
    """The record of the cluster meant (`resolve`): what a command starts from."""
    return read(resolve(name, ended))


def no_clusters() -> str:
    """What a command that needs a cluster says when RAYSTACK_HOME has none."""
    return f"no clusters in {paths.clusters_dir()}: start one with `raystack up --nodes N`"


def resolve(name: str | None, ended: Callable[[ClusterRecord], bool] | None = None) -> str:
    """The cluster meant: NAME, else $RAYSTACK_CLUSTER (which `raystack env` exports, and every
    job has), else the only live cluster, else the only cluster at all. `ended`: whether a record
    has ended (default: as it says; the client also asks SLURM about the live-looking ones)."""
    if name is not None:  # (an empty name is refused: an unset $NAME must never mean the default)
        return paths.validate_name(name, "the cluster (CLUSTER, --cluster/-c)")
    name = os.environ.get("RAYSTACK_CLUSTER") or None
    if name:
        if not exists(paths.validate_name(name, "$RAYSTACK_CLUSTER")):
            raise ClusterError(
                f"no cluster named '{name}' (from $RAYSTACK_CLUSTER) in {paths.clusters_dir()}: "
                "name another with --cluster, or `unset RAYSTACK_CLUSTER`"
            )
        return name
    records = read_all()
    names = [r.name for r in records]
    has_ended = ended or (lambda r: r.state.is_terminal())
    live = [r.name for r in records if not has_ended(r)]
    for candidates in (live, names):
        if len(candidates) == 1:
            return candidates[0]
    if not names:
        raise ClusterError(no_clusters())
    raise ClusterError(
        f"several clusters ({', '.join(live or names)}): name one, e.g. `--cluster {(live or names)[0]}`"
    )


# ---------------------------------------------------------------------------- folder and token
def create(name: str) -> ClusterPaths:
    """Make (or reuse) a cluster's folder with private permissions and a fresh token."""
    p = paths.cluster(name)
    make_private_dirs(p)
    atomic_write(p.token, secrets.token_hex(32), mode=0o600)
    return p


def submitter() -> str:
    """Who writes a cluster's first record: host:pid of this `raystack up`."""
    return f"{socket.gethostname()}:{os.getpid()}"


def ensure_token(name: str) -> Path:
    """The token file, created (0600) when missing: an allocation started by hand has none yet."""
    p = paths.cluster(name)
    if not p.token.exists():
        with locked(p):
            if not p.token.exists():
                atomic_write(p.token, secrets.token_hex(32), mode=0o600)
    return p.token


def read_token(name: str) -> str:
    return paths.cluster(name).token.read_text().strip()


def read_heartbeat(name: str) -> dict[str, Any] | None:
    """The head's last beat ({allocation, host, pid, n, t}: allocation/duties.Heartbeat writes
    it every few seconds), or None when there is none to read."""
    return read_dict(paths.cluster(name).heartbeat) or None


# ---------------------------------------------------------------------------- node entries
