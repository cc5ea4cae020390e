"""The ledger: one JobRecord per job (jobs/<id>.json) with every state it went through.

A JobRequest is a job spec resolved for one cluster: exactly what the queue runner submits.
Both live here, at the bottom, because the allocation and the client both read them.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from raystack.errors import ClusterError
from raystack.store import paths
from raystack.store.cluster import apply_changes
from raystack.store.files import atomic_write, locked


class JobState(str, Enum):
    """A raystack job's state (Ray's own job states map onto SUBMITTED and the final four)."""

    QUEUED = "QUEUED"  # in the cluster's queue, not yet given to Ray
    SUBMITTED = "SUBMITTED"  # accepted by the Jobs API, not running yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # `raystack stop`, or its timeout
    CANCELLED = "CANCELLED"  # removed from the queue before it started

    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED)


class JobRequest(BaseModel):
    """A spec resolved for one cluster: exactly what the queue runner will submit."""

    id: str
    name: str
    cluster: str
    entrypoint: str
    working_dir: str | None = None
    excludes: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    entrypoint_num_cpus: float = 0
    entrypoint_num_gpus: float = 0
    entrypoint_resources: dict[str, float] = Field(default_factory=dict)
    timeout: float | None = None
    retries: int = 0
    stop_grace: float = 30
    outputs: dict[str, str] = Field(default_factory=dict)
    uv: bool = False
    spec_file: str | None = None
    queued_at: float = Field(default_factory=time.time)


class JobRecord(BaseModel):
    """The ledger entry of one job: it outlives the allocation."""

    id: str
    name: str
    state: JobState = JobState.QUEUED
    request: JobRequest
    history: list[dict[str, Any]] = Field(default_factory=list)
    attempts: list[str] = Field(default_factory=list)  # Ray submission ids, one per try
    message: str = ""
    exit_code: int | None = None
    ray_job_id: str | None = None
    stop_requested: float | None = None
    started: float | None = None
    ended: float | None = None

    def time_in(self, state: JobState) -> float | None:
        return next((h["time"] for h in self.history if h["state"] == state.value), None)


def read_job(name: str, job_id: str) -> JobRecord:
    try:
        return JobRecord.model_validate_json(paths.cluster(name).ledger(job_id).read_text())
    except FileNotFoundError:
        raise ClusterError(f"no job '{job_id}' in cluster {name}: see `raystack queue {name}`") from None


def write_job(name: str, record: JobRecord) -> None:
    atomic_write(paths.cluster(name).ledger(record.id), record.model_dump_json(indent=2))


def update_job(name: str, job_id: str, **changes: Any) -> JobRecord:
    """Read-modify-write the ledger under the cluster lock; state changes go into the history."""
    with locked(paths.cluster(name)):
        record = read_job(name, job_id)
        apply_changes(record, changes)
        write_job(name, record)
        return record


def all_jobs(name: str) -> list[JobRecord]:
    folder = paths.cluster(name).jobs
    records = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            records.append(JobRecord.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: r.request.queued_at)
