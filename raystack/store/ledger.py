"""The ledger: one JobRecord per job (jobs/<id>.json) with every state it went through.

A JobRequest is a job spec resolved for one cluster: exactly what the queue runner submits.
Both live here, at the bottom, because the allocation and the client both read them.
"""

from __future__ import annotations

import logging
import secrets as random_tokens
import time
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raystack.errors import ClusterError
from raystack.store import paths
from raystack.store import secrets as job_secrets
from raystack.store.cluster import apply_changes, unknown_member
from raystack.store.files import append_line, atomic_write, create_exclusive, locked, quarantined

log = logging.getLogger("raystack")


class JobState(str, Enum):
    """A raystack job's state (Ray's own job states map onto SUBMITTED and the final four)."""

    QUEUED = "QUEUED"  # in the cluster's queue, not yet given to Ray
    SUBMITTED = "SUBMITTED"  # accepted by the Jobs API, not running yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # `raystack stop`, or its timeout
    CANCELLED = "CANCELLED"  # removed from the queue before it started
    INTERRUPTED = "INTERRUPTED"  # stopped at its allocation's end; back at the head of the queue

    @classmethod
    def _missing_(cls, value: object) -> JobState | None:
        return unknown_member(cls, value)

    @property
    def known(self) -> bool:
        """False for a state written by another version of raystack (kept and shown as it is)."""
        return self._name_ in type(self).__members__

    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED)


class JobRequest(BaseModel):
    """A spec resolved for one cluster: exactly what the queue runner will submit."""

    model_config = ConfigDict(extra="allow")  # (fields of another version are kept, not dropped)

    id: str
    name: str
    cluster: str
    entrypoint: str
    working_dir: str | None = None
    excludes: list[str] = Field(default_factory=list)
    left_out: dict[str, str] = Field(default_factory=dict)  # what the default excludes kept off the nodes
    env: dict[str, str] = Field(default_factory=dict)
    entrypoint_num_cpus: float = 0
    entrypoint_num_gpus: float = 0
    entrypoint_resources: dict[str, float] = Field(default_factory=dict)
    entrypoint_memory: int = 0  # bytes
    runtime_env: dict[str, Any] = Field(default_factory=dict)  # Ray's keys beyond working_dir/env
    metadata: dict[str, str] = Field(default_factory=dict)  # the user's: raystack's own keys win
    after: list[str] = Field(default_factory=list)  # dependencies: ID[:ok|:any|:notok] (ok by default)
    needs: dict[str, Any] = Field(default_factory=dict)  # what it declared it occupies ({}: the cluster)
    sweep: str | None = None  # the sweep it belongs to (<name>-<hex>), and its values there
    sweep_values: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = None
    retries: int = 0
    retry_window: float | None = None  # None: RETRY_WINDOW; 0: any failure is retried
    hang_timeout: float | None = None  # None: the cluster's (profile); 0: off
    hang_action: str | None = None  # "stop" | "warn"; None: the cluster's (profile), else stop
    infeasible_grace: float | None = None  # None: the cluster's (profile)
    stop_grace: float = 30
    outputs: dict[str, str] = Field(default_factory=dict)
    uv: bool = False
    spec_file: str | None = None
    submit_dir: str | None = None  # where `raystack submit` ran: a job without a working_dir runs there
    min_time: float | None = None  # seconds of walltime it needs: not started with less left
    plan: dict[str, Any] | None = None  # the spec's plan: the entrypoint's {plan.*} are filled at start
    planned: str | None = None  # the entrypoint as planned at submit, for the cluster as it was then
    processes: int | None = None  # an SPMD job's processes in all (for a batch plan)
    secrets: list[str] = Field(default_factory=list)  # names only: the values are in secrets/<nonce>.env
    queued_at: float = Field(default_factory=time.time)
    # Travels in the Ray job's metadata: a Ray job with our submission id but another nonce
    # is not ours (an id reused after a ledger was lost), so its state is never inherited.
    nonce: str = Field(default_factory=partial(random_tokens.token_hex, 8))


class Attempt(BaseModel):
    """One submission of a job to Ray, in one allocation."""

    model_config = ConfigDict(extra="allow")

    id: str  # the Ray submission id
    allocation: str | None = None  # the SLURM job id of the allocation it was given to
    at: float = Field(default_factory=time.time)
    ray_job_id: str | None = None  # Ray's id of it (hex): its workers' log files carry it
    entrypoint: str | None = None  # what Ray ran (a plan's {plan.*} filled for the cluster then)
    outcome: str | None = None  # how it ended when another attempt followed: "FAILED: exit code 1 ..."
    nodes: list[str] = Field(default_factory=list)  # a packed job's nodes (addresses); []: the cluster
    node_ids: list[str] = Field(default_factory=list)  # their Ray node ids (its actors are pinned to them)


class JobRecord(BaseModel):
    """The ledger entry of one job: it outlives the allocation."""

    model_config = ConfigDict(validate_assignment=True, extra="allow")

    id: str
    name: str
    state: JobState = JobState.QUEUED
    request: JobRequest
    now: bool = False  # `--now`: submitted beside the line, not in it
    entry: str | None = None  # its file in queue/ while it waits (<seq>-<id>)
    # What an interrupted job is submitted with when it resumes (the spec's `resume:` applied).
    resume_request: JobRequest | None = None
    interruptions: int = 0
    history: list[dict[str, Any]] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    message: str = ""
    exit_code: int | None = None
    ray_job_id: str | None = None
    # The first error line in its actors' worker logs: "node7 LearnerActor pid 4121: ..."
    actor_error: str | None = None
    stop_requested: float | None = None
    started: float | None = None
    ended: float | None = None
    fault: str | None = None  # "infeasible" or "hung": why raystack stopped it (never retried)
    suspected: float | None = None  # (wall) since when it showed no progress, while a hang is suspected
    evicted: str | None = None  # why its nodes leave the cluster: stopped, then requeued (shrink)
    # Its environment, made while the job before it ran (allocation/runner/prepare.py): what, where, how long.
    prepared: str | None = None
    # How the queue went from the job before it to this one (it waited while that one ran), as
    # wall-clock times: that job's end in Ray (`ended`), seen by the runner (`seen`), its log and
    # ledger complete (`closed`), its resources free (`free`), this job's submit begun (`submit`)
    # and answered (`submitted`).
    gap: dict[str, Any] | None = None

    @property
    def attempt_ids(self) -> list[str]:
        return [a.id for a in self.attempts]

    def time_in(self, state: JobState) -> float | None:
        return next((h["time"] for h in self.history if h["state"] == state.value), None)


class Unreadable(ClusterError):
    """A ledger entry exists but cannot be read (left where it is: readers never move files)."""


def read_job(name: str, job_id: str) -> JobRecord:
    """The ledger entry of a job. Raises ClusterError when there is none, Unreadable when it
    cannot be read; either way nothing is moved or changed."""
    path = paths.cluster(name).ledger(job_id)
    try:
        return JobRecord.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise ClusterError(f"no job '{job_id}' in cluster {name}: see `raystack queue {name}`") from None
    except (ValidationError, ValueError, OSError) as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        raise Unreadable(
            f"the ledger of job '{job_id}' cannot be read ({why}); it is left at {path}"
        ) from None


def write_job(name: str, record: JobRecord) -> None:
    atomic_write(paths.cluster(name).ledger(record.id), record.model_dump_json(indent=2))


def create_job(name: str, record: JobRecord) -> bool:
    """Write a new ledger entry, never over an existing one (O_EXCL); False if the id is taken."""
    return create_exclusive(paths.cluster(name).ledger(record.id), record.model_dump_json(indent=2))


def update_job(name: str, job_id: str, attempt: dict[str, Any] | None = None, **changes: Any) -> JobRecord:
    """Read-modify-write the ledger under the cluster lock; state changes go into the history.
    `attempt`: fields of the last attempt to set in the same transaction."""
    with locked(paths.cluster(name)):
        return change_job(name, job_id, attempt, **changes)


def change_job(name: str, job_id: str, attempt: dict[str, Any] | None = None, **changes: Any) -> JobRecord:
    """`update_job` for a caller that already holds the lock (one transaction, several changes)."""
    record = read_job(name, job_id)
    if attempt and record.attempts:
        changes["attempts"] = [*record.attempts[:-1], record.attempts[-1].model_copy(update=attempt)]
    apply_changes(record, changes)
    write_job(name, record)
    if record.state.is_terminal() and "state" in changes:
        append_line(paths.cluster(name).finished, f"{time.time():.3f} {record.id} {record.state.value}")
        for request in (record.request, record.resume_request):  # (its secrets go with it)
            if request is not None and request.secrets:
                job_secrets.forget(name, request.nonce)
    return record


def all_jobs(name: str) -> list[JobRecord]:
    """Every readable ledger entry, oldest first (O(jobs): for listings, not for hot paths)."""
    folder = paths.cluster(name).jobs
    records = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            records.append(read_job(name, path.stem))
        except ClusterError as exc:
            log.warning("%s", exc)
    return sorted(records, key=lambda r: r.request.queued_at)


def set_aside(name: str) -> dict[str, Path]:
    """Jobs whose ledger could not be read and was moved into corrupt/ (they did not run from
    it): id -> where it lies now, so listings and lookups can say so instead of losing them."""
    p = paths.cluster(name)
    moved = quarantined(p, p.jobs)
    return {file.removesuffix(".json"): target for file, target in moved.items() if file.endswith(".json")}


def recently_finished(name: str, count: int) -> list[str]:
    """Ids of the last `count` jobs that reached a final state, newest last (reads the tail only)."""
    path = paths.cluster(name).finished
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - 200 * (count + 1))
            fh.seek(start)
            lines = fh.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    if start:
        lines = lines[1:]  # the first line read may be cut
    ids: list[str] = []
    for line in lines:
        entry = finished_entry(line)
        if entry and entry[0] not in ids:
            ids.append(entry[0])
    return ids[-count:]


def finished_states(name: str) -> dict[str, str]:
    """Every job of the finished index with the last final state it recorded (reads it whole)."""
    try:
        lines = paths.cluster(name).finished.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return {}
    return dict(entry for line in lines if (entry := finished_entry(line)))


def finished_entry(line: str) -> tuple[str, str] | None:
    """A line of the finished index ('<time> <id> <STATE>', as change_job appends it) as
    (id, state); None for a line cut short."""
    parts = line.split()
    return (parts[1], parts[2]) if len(parts) == 3 else None
