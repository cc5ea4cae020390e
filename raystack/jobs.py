"""Jobs: a validated spec becomes a JobRequest (resolved against the filesystem and the cluster),
then a Ray Jobs API submission (entrypoint + runtime_env + metadata). The ledger (JobRecord,
`clusters/<name>/jobs/<id>.json`) records every state a job went through.

This is the only module that speaks to the Jobs API about jobs (rayapi.py holds the shared
helpers for reaching the dashboard).
"""

from __future__ import annotations

import math
import time
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from raystack import rayapi, registry
from raystack.errors import ConfigError, RayApiError
from raystack.registry import ClusterRecord
from raystack.spec import DEFAULT_EXCLUDES, JobSpec, new_job_id


class JobState(str, Enum):
    """A raystack job's state (Ray's own job states map onto the last five)."""

    QUEUED = "QUEUED"  # in the cluster's queue, not yet given to Ray
    SUBMITTED = "SUBMITTED"  # accepted by the Jobs API, not running yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # `raystack stop`, or its timeout
    CANCELLED = "CANCELLED"  # removed from the queue before it started

    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED)


# Ray's JobStatus values -> ours (one table; anything unknown stays SUBMITTED).
RAY_STATES = {
    "PENDING": JobState.SUBMITTED,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "STOPPED": JobState.STOPPED,
}


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


# ---------------------------------------------------------------------------- resolution
def check_needs(spec: JobSpec, cluster: ClusterRecord, source: str) -> None:
    """Refuse, before queueing, a job that cannot fit the cluster (a bundle that does not fit hangs)."""
    nodes, gpn, cpn = cluster.nodes_expected, cluster.gpus_per_node, cluster.cpus_per_node
    fix = "lower it, or start a larger cluster with raystack up"
    n = spec.needs
    have = f"cluster '{cluster.name}' has {nodes} nodes x {gpn} GPUs"
    if n.nodes is not None and n.nodes > nodes:
        raise ConfigError(f"{source}: needs.nodes={n.nodes} but {have}; {fix}")
    if n.gpus is not None and n.gpus > nodes * gpn:
        raise ConfigError(f"{source}: needs.gpus={n.gpus} but {have} = {nodes * gpn}; {fix}")
    if n.gpus_per_node is not None and n.gpus_per_node > gpn:
        raise ConfigError(f"{source}: needs.gpus_per_node={n.gpus_per_node} but {have}; {fix}")
    if n.cpus_per_gpu is not None and cpn:
        per_node = n.cpus_per_gpu * (n.gpus_per_node or gpn)
        if per_node > cpn:
            raise ConfigError(
                f"{source}: needs.cpus_per_gpu={n.cpus_per_gpu:g} asks {per_node:g} CPUs per node "
                f"but cluster '{cluster.name}' has {cpn}; lower it or raise cpus_per_task"
            )
    if spec.entrypoint_num_gpus > gpn:
        raise ConfigError(f"{source}: entrypoint_num_gpus={spec.entrypoint_num_gpus:g} but {have}; {fix}")
    if cpn and spec.entrypoint_num_cpus > cpn:
        raise ConfigError(
            f"{source}: entrypoint_num_cpus={spec.entrypoint_num_cpus:g} but nodes have {cpn} CPUs"
        )


def upload_size(folder: Path, excludes: list[str]) -> int:
    """Bytes Ray would package from `folder` (Ray's own exclude matching, .gitignore/.rayignore)."""
    # NOTE: private Ray helpers (ray 2.60), used so that our check agrees with Ray's packaging.
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    total = 0

    def add(path: Path) -> None:
        nonlocal total
        if path.is_file():
            total += path.stat().st_size

    _dir_travel(folder, [_get_excludes(folder, excludes)], add, include_gitignore=True, logger=None)
    return total


def upload_limit() -> int:
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

    return int(GCS_STORAGE_MAX_SIZE)


def resolve(
    spec: JobSpec, cluster: ClusterRecord, base_dir: Path, source: str, spec_file: str | None = None
) -> JobRequest:
    """Check and resolve a spec for a cluster; nothing is written."""
    check_needs(spec, cluster, source)
    working_dir = None
    excludes = [*DEFAULT_EXCLUDES, *spec.excludes]
    if spec.working_dir is not None:
        folder = (base_dir / spec.working_dir).resolve()
        if not folder.is_dir():
            raise ConfigError(
                f"{source}: working_dir '{spec.working_dir}' is not a folder ({folder}); "
                "fix the path (relative paths start at the spec's folder)"
            )
        size, limit = upload_size(folder, excludes), upload_limit()
        if size >= limit:
            raise ConfigError(
                f"{source}: working_dir {folder} is {size / 2**20:.0f} MiB, over Ray's upload "
                f"limit of {limit / 2**20:.0f} MiB; add large folders to excludes"
            )
        working_dir = str(folder)
    outputs = {key: str((base_dir / path).resolve()) for key, path in spec.outputs.items()}
    return JobRequest(
        id=new_job_id(spec.name),
        name=spec.name,
        cluster=cluster.name,
        entrypoint=spec.entrypoint,
        working_dir=working_dir,
        excludes=excludes,
        env=dict(spec.env),
        entrypoint_num_cpus=spec.entrypoint_num_cpus,
        entrypoint_num_gpus=spec.entrypoint_num_gpus,
        entrypoint_resources=dict(spec.entrypoint_resources),
        timeout=spec.timeout,
        retries=spec.retries,
        stop_grace=spec.stop_grace,
        outputs=outputs,
        uv=spec.uv,
        spec_file=spec_file,
    )


def job_env(request: JobRequest, cluster: ClusterRecord) -> dict[str, str]:
    """The environment conventions every job gets (documented in the README), spec env on top."""
    env = {
        # Frameworks call ray.init(runtime_env={"env_vars": dict(os.environ)}), which otherwise
        # fails to merge with the job's own env_vars.
        "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "1" if request.uv else "0",
        "RAYSTACK_CLUSTER": cluster.name,
        "RAYSTACK_JOB_ID": request.id,
        # Read by Ray's job supervisor: SIGTERM, then SIGKILL after this many seconds.
        "RAY_JOB_STOP_WAIT_TIME_S": str(max(1, math.ceil(request.stop_grace))),
    }
    if cluster.walltime_end:
        env["RAYSTACK_DEADLINE"] = str(int(cluster.walltime_end))
    for key, path in request.outputs.items():
        env[f"RAYSTACK_OUTPUT_{key.upper()}"] = path
    env.update(request.env)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def runtime_env(request: JobRequest, cluster: ClusterRecord) -> dict[str, Any]:
    renv: dict[str, Any] = {"env_vars": job_env(request, cluster)}
    if request.working_dir:
        renv["working_dir"] = request.working_dir
        renv["excludes"] = request.excludes
    return renv


# ---------------------------------------------------------------------------- Jobs API
class JobsApi:
    """Ray's JobSubmissionClient for one cluster, with its token."""

    def __init__(self, url: str, token: str):
        from ray.job_submission import JobSubmissionClient

        try:
            self.client = JobSubmissionClient(url, headers=rayapi.auth_headers(token))
        except Exception as exc:
            raise RayApiError(f"Jobs API at {url} did not answer: {exc}") from exc

    @classmethod
    def for_cluster(cls, name: str) -> JobsApi:
        record = registry.read(name)
        if not record.dashboard_url:
            raise RayApiError(f"cluster {name} has no Jobs API yet ({record.state.value})")
        return cls(record.dashboard_url, registry.read_token(name))

    def submit(self, request: JobRequest, cluster: ClusterRecord, submission_id: str) -> None:
        self.client.submit_job(
            entrypoint=request.entrypoint,
            submission_id=submission_id,
            runtime_env=runtime_env(request, cluster),
            entrypoint_num_cpus=request.entrypoint_num_cpus or None,
            entrypoint_num_gpus=request.entrypoint_num_gpus or None,
            entrypoint_resources=request.entrypoint_resources or None,
            metadata={
                "raystack_job": request.id,
                "raystack_name": request.name,
                "raystack_cluster": cluster.name,
            },
        )

    def info(self, submission_id: str) -> Any | None:
        """Ray's JobDetails, or None when Ray does not know this submission id."""
        try:
            return self.client.get_job_info(submission_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                return None
            raise

    def logs(self, submission_id: str) -> str:
        return str(self.client.get_job_logs(submission_id))

    def stop(self, submission_id: str) -> bool:
        return bool(self.client.stop_job(submission_id))
