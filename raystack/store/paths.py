"""Every path in a cluster's folder, defined once.

$RAYSTACK_HOME/clusters/<name>/          (0700)
  cluster.json         the cluster record (ClusterRecord), written atomically under the lock
  token                the Ray auth token (0600)
  .lock                flock'ed by every read-modify-write of the folder
  .locks               `link` where flock cannot be trusted here: .lock.link is the lock then
  .lockprobe           flock'ed by the head's node program while it lives (`up` checks it is seen)
  raystack.sbatch      the allocation script that was submitted
  nodes/<host>.json    one entry per node of the current allocation (ip, pid, GPU report)
  queue/<seq>-<id>     one empty file per job not yet started, in queue order (the name orders it)
  queue/journal        one line per change of the queue (appended), so the runner reads only changes
  active/<id>          one empty file per job given to Ray and not yet finished
  jobs/<id>.json       the ledger (JobRecord): every state a job went through
  jobs/finished        one line per job that reached a final state (appended), newest last
  runner.lease         held (locked) by the one queue runner, with its heartbeat
  head.beat            the head's node program rewrites it every few seconds (workers, status)
  walltime-warning-<j> left by allocation j's batch shell at SLURM's walltime warning
  usage/<j>-<host>.jsonl one line per usage sample of allocation j's node (CPU, memory, GPUs)
  reports/             (left by older versions: `raystack report` draws into paths.cache())
  logs/                allocation-<jobid>.log, node-<host>.log, queue-runner.log, jobs/<id>[.<n>].log,
                       prometheus-<jobid>.log
  logs/ray/<host>/     Ray's own logs of that node (raylet, GCS, dashboard, workers), copied by its node
                       program while it runs (capped: store/raylogs.py); an earlier allocation's in
                       logs/ray/<host>/<jobid>/
  logs/jobs/<id>/      the worker logs of a job's actors, gathered when it ends (actors.json indexes them)
  corrupt/             files moved aside because they could not be read
  tls/                 with `up --tls`: the cluster's CA and each node's certificate (store/tls.py)
  secrets/<nonce>.env  a queued or running job's secrets (0600), removed when it ends (store/secrets.py)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from raystack.errors import ConfigError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

RECORD = "cluster.json"
TOKEN = "token"
SCRIPT = "raystack.sbatch"
LOGS = "logs"
NODE_LOG = "node-{host}.log"
ALLOCATION_LOG = "allocation-{job}.log"
WARNING = "walltime-warning-{job}"


def home() -> Path:
    """$RAYSTACK_HOME, default ~/.raystack: on the shared filesystem, seen by every node."""
    return Path(os.environ.get("RAYSTACK_HOME") or Path.home() / ".raystack").expanduser()


def cache() -> Path:
    """What readers make for the user (`raystack report`'s plots): $XDG_CACHE_HOME/raystack, default
    ~/.cache/raystack; never the cluster folder, which only the cluster's own programs write."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "raystack"


def clusters_dir() -> Path:
    return home() / "clusters"


def name_fault(value: object) -> str:
    """What keeps `value` from being a name raystack writes files by (a cluster's, a job's id),
    said exactly: its length, the characters it may not hold, how it starts. '' when it is one."""
    if not isinstance(value, str):
        return f"{value!r} is not text"
    if NAME.fullmatch(value):
        return ""
    if not value:
        return "it is empty"
    if len(value) > 63:
        return f"it has {len(value)} characters; at most 63"
    bad = sorted(set(c for c in value if not (c.isascii() and (c.isalnum() or c in "._-"))))
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        return f"it holds {shown}: only ASCII letters, digits, '.', '_' and '-'"
    return f"it starts with {value[0]!r}: start with a letter or digit"


def shown(value: str, most: int = 40) -> str:
    """A value as an error message quotes it: whole when short, else its start and its length."""
    return repr(value) if len(value) <= most else f"{value[:most]!r}... ({len(value)} characters)"


def validate_name(name: str, field: str = "--name") -> str:
    if fault := name_fault(name):
        hint = " (an unset variable in a script?)" if not name else ""
        raise ConfigError(f"{field}: {shown(name)} is not a valid cluster name: {fault}{hint}")
    return name


def validate_job_id(job_id: str) -> str:
    """A job id names files in the cluster folder: never a path (`../cluster`), never empty."""
    if fault := name_fault(job_id):
        raise ConfigError(
            f"{shown(job_id)} is not a job id: {fault} (ids are as printed by `raystack submit`; list them "
            "with `raystack queue`)"
        )
    return job_id


@dataclass(frozen=True)
class ClusterPaths:
    """The folder of one cluster and everything in it: plain attributes, computed once when the
    handle is made (a command makes one and passes it along)."""

    name: str
    root: Path
    record: Path = field(init=False)
    token: Path = field(init=False)
    lock: Path = field(init=False)
    link_lock: Path = field(init=False)
    lock_mode: Path = field(init=False)
    lock_probe: Path = field(init=False)
    script: Path = field(init=False)
    nodes: Path = field(init=False)
    queue: Path = field(init=False)
    journal: Path = field(init=False)
    active: Path = field(init=False)
    jobs: Path = field(init=False)
    finished: Path = field(init=False)
    logs: Path = field(init=False)
    job_logs: Path = field(init=False)
    ray_logs: Path = field(init=False)
    usage: Path = field(init=False)
    corrupt: Path = field(init=False)
    runner_log: Path = field(init=False)
    heartbeat: Path = field(init=False)
    runner_lease: Path = field(init=False)
    tls: Path = field(init=False)
    secrets: Path = field(init=False)

    def __post_init__(self) -> None:
        root, logs = self.root, self.root / LOGS
        named = {
            "record": root / RECORD,
            "token": root / TOKEN,
            "lock": root / ".lock",
            "link_lock": root / ".lock.link",
            "lock_mode": root / ".locks",
            "lock_probe": root / ".lockprobe",
            "script": root / SCRIPT,
            "nodes": root / "nodes",
            "queue": root / "queue",
            "journal": root / "queue" / "journal",
            "active": root / "active",
            "jobs": root / "jobs",
            "finished": root / "jobs" / "finished",
            "logs": logs,
            "job_logs": logs / "jobs",
            "ray_logs": logs / "ray",
            "usage": root / "usage",
            "corrupt": root / "corrupt",
            "runner_log": logs / "queue-runner.log",
            "heartbeat": root / "head.beat",
            "runner_lease": root / "runner.lease",
            "tls": root / "tls",
            "secrets": root / "secrets",
        }
        for key, path in named.items():
            object.__setattr__(self, key, path)

    def ray_host_logs(self, host: str) -> Path:
        """Where node `host`'s node program copies Ray's logs (its current allocation's)."""
        return self.ray_logs / host

    def job_files(self, job_id: str) -> Path:
        """The worker logs of a job's actors, gathered when it ends, with their index."""
        return self.job_logs / validate_job_id(job_id)

    def usage_file(self, alloc_id: str, host: str) -> Path:
        """Allocation `alloc_id`'s usage samples of node `host` (appended by its node program)."""
        return self.usage / f"{alloc_id}-{host}.jsonl"

    def node_entry(self, host: str) -> Path:
        return self.nodes / f"{host}.json"

    def node_log(self, host: str) -> Path:
        return self.logs / NODE_LOG.format(host=host)

    def prometheus_log(self, job: str) -> Path:
        return self.logs / f"prometheus-{job}.log"

    def allocation_log(self, job: str) -> Path:
        return self.logs / ALLOCATION_LOG.format(job=job)

    def warning(self, job: str) -> Path:
        """Left by allocation `job`'s batch shell when SLURM warns of its walltime (USR1)."""
        return self.root / WARNING.format(job=job)

    def ledger(self, job_id: str) -> Path:
        return self.jobs / f"{validate_job_id(job_id)}.json"

    def job_log(self, job_id: str, attempt: int = 1) -> Path:
        """The driver log of one attempt of a job (the first: <id>.log, later: <id>.<n>.log)."""
        validate_job_id(job_id)
        return self.job_logs / (f"{job_id}.log" if attempt == 1 else f"{job_id}.{attempt}.log")

    def folders(self) -> list[Path]:
        """Every folder the cluster needs (created 0700)."""
        return [
            *(self.root, self.nodes, self.queue, self.active, self.jobs),
            *(self.logs, self.job_logs, self.ray_logs, self.usage),
        ]


def cluster(name: str) -> ClusterPaths:
    """The paths of cluster `name` (validated: it becomes a folder name)."""
    return ClusterPaths(validate_name(name), clusters_dir() / name)
