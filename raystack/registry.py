"""The cluster folder on the shared filesystem: the meeting point of allocation and client.

$RAYSTACK_HOME/clusters/<name>/   (0700)
  cluster.json   the record (ClusterRecord), written atomically under a lock
  token          Ray auth token (0600)
  raystack.sbatch  the allocation script that was submitted
  nodes/<host>.json  one entry per node that started (ip, pid, log)
  logs/          allocation and per-node logs that outlive the allocation
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from raystack.errors import ClusterError, ConfigError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ClusterState(str, Enum):
    """The Ray cluster's state (never SLURM's: see slurm.JobState)."""

    SUBMITTED = "SUBMITTED"  # sbatch accepted it; the allocation may be pending
    STARTING = "STARTING"  # the allocation runs; Ray is coming up
    READY = "READY"  # every node, GPU and CPU registered and the Jobs API answers
    STOPPING = "STOPPING"  # `down` asked for it
    STOPPED = "STOPPED"  # ended by `down` or by the allocation's own end
    FAILED = "FAILED"  # could not start, or died

    def is_terminal(self) -> bool:
        return self in (ClusterState.STOPPED, ClusterState.FAILED)


class ClusterRecord(BaseModel):
    """cluster.json: everything a client needs to find and judge a cluster."""

    model_config = ConfigDict(extra="ignore")

    name: str
    state: ClusterState = ClusterState.SUBMITTED
    message: str = ""
    profile: str = "generic"
    slurm_job_id: str | None = None
    nodes_expected: int = 0
    gpus_per_node: int = 0
    cpus_per_node: int = 0
    nodes: list[str] = Field(default_factory=list)  # host names, head first
    nodes_joined: int = 0
    head_host: str | None = None
    head_ip: str | None = None
    ports: dict[str, int] = Field(default_factory=dict)
    gcs_address: str | None = None
    dashboard_url: str | None = None
    walltime_end: int | None = None  # epoch seconds
    ray_version: str | None = None
    runner_pid: int | None = None  # the queue runner on the head
    runner_restarts: int = 0
    created: float = Field(default_factory=time.time)
    updated: float = Field(default_factory=time.time)
    history: list[dict[str, Any]] = Field(default_factory=list)  # state changes with times


def home() -> Path:
    return Path(os.environ.get("RAYSTACK_HOME") or Path.home() / ".raystack").expanduser()


def clusters_dir() -> Path:
    return home() / "clusters"


def validate_name(name: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(
            f"--name: {name!r} is not a valid cluster name; use letters, digits, '.', '_' and '-' "
            "(at most 63, starting with a letter or digit)"
        )
    return name


def cluster_dir(name: str) -> Path:
    return clusters_dir() / validate_name(name)


def record_path(name: str) -> Path:
    return cluster_dir(name) / "cluster.json"


def token_path(name: str) -> Path:
    return cluster_dir(name) / "token"


def logs_dir(name: str) -> Path:
    return cluster_dir(name) / "logs"


def atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """An exclusive lock on one cluster's folder (flock on .lock)."""
    with open(cluster_dir(name) / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def create(name: str) -> Path:
    """Make (or reuse) a cluster's folder with private permissions and a fresh token."""
    path = cluster_dir(name)
    clusters_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    path.mkdir(exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    for sub in ("logs", "nodes"):
        (path / sub).mkdir(exist_ok=True, mode=0o700)
    atomic_write(token_path(name), secrets.token_hex(32), mode=0o600)
    return path


def ensure_token(name: str) -> Path:
    """The token file, created (0600) when missing: an allocation started by hand has none yet."""
    path = token_path(name)
    if not path.exists():
        with locked(name):
            if not path.exists():
                atomic_write(path, secrets.token_hex(32), mode=0o600)
    return path


def read_token(name: str) -> str:
    return token_path(name).read_text().strip()


def exists(name: str) -> bool:
    return record_path(name).is_file()


def read(name: str) -> ClusterRecord:
    try:
        return ClusterRecord.model_validate_json(record_path(name).read_text())
    except FileNotFoundError:
        known = ", ".join(list_names()) or "none"
        raise ClusterError(
            f"no cluster named '{name}' in {clusters_dir()} (known: {known}); start one with "
            f"`raystack up --name {name}`"
        ) from None


def write(record: ClusterRecord) -> None:
    record.updated = time.time()
    atomic_write(record_path(record.name), record.model_dump_json(indent=2), mode=0o600)


def update(name: str, **changes: Any) -> ClusterRecord:
    """Read-modify-write under the lock; a state change is appended to the history."""
    with locked(name):
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


def list_names() -> list[str]:
    base = clusters_dir()
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "cluster.json").is_file())


def resolve(name: str | None) -> str:
    """The cluster meant: NAME, or the only live cluster, or the only cluster at all."""
    if name:
        return validate_name(name)
    names = list_names()
    live = [n for n in names if not read(n).state.is_terminal()]
    for candidates in (live, names):
        if len(candidates) == 1:
            return candidates[0]
    if not names:
        raise ClusterError(f"no clusters in {clusters_dir()}: start one with `raystack up --nodes N`")
    raise ClusterError(
        f"several clusters ({', '.join(live or names)}): name one, e.g. `--cluster {(live or names)[0]}`"
    )


def write_node_entry(name: str, host: str, entry: dict[str, Any]) -> None:
    atomic_write(cluster_dir(name) / "nodes" / f"{host}.json", json.dumps(entry), mode=0o600)


def read_node_entries(name: str) -> dict[str, dict[str, Any]]:
    folder = cluster_dir(name) / "nodes"
    entries = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            entries[path.stem] = json.loads(path.read_text())
    return entries
