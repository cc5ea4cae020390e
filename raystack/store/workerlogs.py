"""A job's view of Ray's logs in the cluster folder: its actors' worker logs, found by the job's Ray
id in their file names and first lines among the nodes' copies (raylogs.py), gathered under
logs/jobs/<id>/ with an index, and the first error among them, a worker's hard death named before
its peers' echoes."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raystack.store import paths
from raystack.store.files import atomic_write
from raystack.store.raylogs import host_folder, read_copy

INDEX = "actors.json"  # in logs/jobs/<id>/: the job's workers, their files and first errors


WORKER = re.compile(r"^worker-([0-9a-f]+)-([0-9a-f]+)-(\d+)\.(out|err)$")  # id, job (or nil), pid


CORE = "python-core-worker-{wid}_{pid}.log"


MARKERS = (":job_id:", ":actor_name:", ":task_name:")  # lines Ray starts a worker's output with


# Ray's words for an actor whose worker process went away (no exception of its own to report)
DIED = re.compile(r"worker process has died|ActorDiedError|actor is dead|connection error code", re.I)


# What counts as an error in a worker's output: the exception line that ends a traceback, or a
# line that says so on its own (CUDA/NCCL errors, fatal signals, the OOM killer's trace).
EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Fault)\b.*)$")


FATAL = re.compile(
    r"(CUDA error|NCCL error|NCCL WARN|Fatal Python error|Segmentation fault|\*\*\* SIG\w+ received|"
    r"OutOfMemory|out of memory|Killed|core dumped|collective operation timeout|watchdog got stuck|"
    r"terminate called after)",
    re.IGNORECASE,
)


# An error that says the other side of a connection went away (gloo, NCCL, torch's TCPStore): the
# consequence of a peer's death, which Ray records a moment later. Within CAUSE seconds of it, a
# worker that died hard is named first.
PEER_GONE = re.compile(
    r"closed by peer|reset by peer|Broken pipe|remote process exit|ncclRemoteError|Connection refused", re.I
)


CAUSE = 30.0


@dataclass
class WorkerLog:
    """One Ray worker of a job on one node: an actor (or the tasks it ran) and its files."""

    host: str
    actor: str
    pid: int
    ray_job_id: str
    attempt: int
    worker_id: str = ""
    files: list[str] = field(default_factory=list)
    """Relative to logs/jobs/<id>/."""
    error: str | None = None
    """Its first error line (from its output, or the error Ray recorded)."""
    at: float | None = None
    """When that error happened (Ray's time) or was copied (its log's)."""
    last_err: list[str] = field(default_factory=list)
    """Its stderr's last lines (Ray's markers aside)."""

    @property
    def label(self) -> str:
        return f"{self.host} {self.actor}" + (f" pid {self.pid}" if self.pid else "")


def first_error(text: str) -> str | None:
    """The first error line of a worker's output: the exception line that ends a traceback, or
    a line naming a CUDA/NCCL error, a fatal signal or an out-of-memory kill."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            for follow in lines[i + 1 :]:
                if follow and not follow[0].isspace() and EXCEPTION.match(follow):
                    return follow.strip()[:300]
        elif EXCEPTION.match(line) or FATAL.search(line):
            return line.strip()[:300]
    return None


def last_exception(text: str) -> str:
    """The exception line of an error Ray recorded (the last one: the root cause of a chain)."""
    found = [ln for ln in text.splitlines() if ln and not ln[0].isspace() and EXCEPTION.match(ln)]
    if found:
        return found[-1].strip()[:300]
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else "error"


def died_words(text: str) -> str:
    """Ray's words for an actor whose process went away, short, with what they mean."""
    kind = re.search(r"Worker exit type: (\w+)", text)
    if "connection error code" in text or "End of file" in text:
        return (
            "its process died abruptly (killed by a signal such as SIGKILL or the out-of-memory killer, "
            f"or a crash such as SIGSEGV; Ray: {kind[1] if kind else 'worker died'})"
        )
    detail = re.search(r"Worker exit detail: ([^.]*\.)", text)
    if detail:
        return f"its process died ({f'{kind[1]}: ' if kind else ''}{detail[1]})"
    return last_exception(text)


def _errors_among(lines: list[str]) -> str:
    """The error lines among a worker's last stderr lines ('' when they say nothing of one)."""
    return " | ".join(ln for ln in lines[-3:] if EXCEPTION.match(ln) or FATAL.search(ln))


def _only(found: dict[tuple[str, int], WorkerLog], host: str, actor: str) -> WorkerLog | None:
    """The one worker of `actor` on `host` (a failed task's record may lack the pid), else None."""
    same = [w for (h, _), w in found.items() if h == host and w.actor == actor and w.pid]
    return same[0] if len(same) == 1 else None


def _markers(text: str) -> tuple[str | None, str]:
    """The Ray job a worker served (`:job_id:`) and its actor (`:actor_name:`) or task name."""
    job = actor = task = None
    job_mark, actor_mark, task_mark = MARKERS
    for line in text.splitlines()[:200]:
        if line.startswith(job_mark) and job is None:
            job = line.removeprefix(job_mark).strip()
        elif line.startswith(actor_mark):
            actor = line.removeprefix(actor_mark).strip()
        elif line.startswith(task_mark) and task is None:
            task = line.removeprefix(task_mark).strip()
    return job, actor or (f"task {task}" if task else "worker")


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name)[:80] or "worker"


def gather(
    cluster: str,
    record: Any,
    events: list[dict[str, Any]] | None = None,
    hosts: dict[str, str] | None = None,
    out_dir: Path | None = None,
) -> list[WorkerLog]:
    """Gather the worker logs of job `record`'s actors (every attempt with a Ray job id; a worker
    says which job it serves in its first line) from the nodes' copies into
    logs/jobs/<id>/<host>/<actor>-<pid>.{err,out,core.log}, with an index (actors.json).
    `events`: the failures Ray recorded (adapters.ray.job_errors, by node address `ip`, mapped to
    hosts by `hosts`), kept as <actor>-<pid>.error. Workers with an error first, earliest first.
    `out_dir`: where to, for a reader (the cluster's runner writes logs/jobs/<id>/)."""
    p = paths.cluster(cluster)
    out_dir = out_dir or p.job_files(record.id)
    by_allocation: dict[str | None, dict[str, int]] = {}
    """Ray job id -> attempt, per allocation."""
    for n, attempt in enumerate(record.attempts, 1):
        if attempt.ray_job_id:
            by_allocation.setdefault(attempt.allocation, {})[attempt.ray_job_id] = n
    found: dict[tuple[str, int], WorkerLog] = {}
    for allocation, attempts in by_allocation.items():  # (each host's folder read once)
        for host_dir in sorted(p.ray_logs.iterdir()) if p.ray_logs.is_dir() else []:
            folder = host_folder(cluster, host_dir.name, allocation) if host_dir.is_dir() else None
            if folder is not None:
                for w in _gather_host(folder, host_dir.name, attempts, out_dir):
                    found[(w.host, w.pid)] = w
    recorded = _place_events(found, record, events or [], hosts or {})
    for rel, texts in recorded.items():
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / rel, "".join(texts))
    ordered = by_error(list(found.values()))
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / INDEX, json.dumps([asdict(w) for w in ordered], indent=1))
    return ordered


def _place_events(
    found: dict[tuple[str, int], WorkerLog], record: Any, events: list[dict[str, Any]], hosts: dict[str, str]
) -> dict[str, list[str]]:
    """The failures Ray recorded, onto the workers `found` (a new entry where none is): the
    texts to keep per <host>/<actor>-<pid>.error file."""
    last = len(record.attempts)
    recorded: dict[str, list[str]] = {}
    # A local cluster binds to 127.0.0.1, and Ray may name its node by the machine's address:
    # there, every address is that one node.
    loopback = [h for ip, h in hosts.items() if ip.startswith("127.")]
    only = loopback[0] if len(set(hosts.values())) == 1 and loopback else None
    for event in events:
        ip = event.get("ip") or ""
        host = hosts.get(ip) or only or ip or "unknown"
        pid = int(event.get("pid") or 0)
        worker = found.get((host, pid)) or (None if pid else _only(found, host, str(event.get("actor"))))
        if worker is None:
            ray_job = record.attempts[-1].ray_job_id or ""
            worker = found[(host, pid)] = WorkerLog(host, str(event.get("actor")), pid, ray_job, last)
        rel = f"{host}/{_safe(worker.actor)}-{worker.pid}.error"
        text = str(event["error"])
        recorded.setdefault(rel, []).append(text.rstrip("\n") + "\n")
        if rel not in worker.files:
            worker.files.append(rel)
        at = event.get("at")
        if DIED.search(text):
            # A worker that died hard (os._exit, a signal, the OOM killer): Ray knows only that its
            # process went; an error it wrote last on its stderr says why, if it wrote one.
            died, own = died_words(text), worker.error or _errors_among(worker.last_err)
            if not own or says_died(own):
                worker.error = own or died
            else:
                worker.error = f"{own} (then {died})"
            worker.at = min(a for a in (at, worker.at) if a) if (at or worker.at) else None
        elif worker.error is None or (at and (worker.at is None or at < worker.at)):
            worker.error, worker.at = last_exception(text), at
    return recorded


def says_died(error: str | None) -> bool:
    """Whether an error line is (or ends with) Ray's word that the worker's process died."""
    return bool(error) and "process died" in str(error)


def by_error(workers: list[WorkerLog]) -> list[WorkerLog]:
    """Workers with an error first, the earliest first, unless it says its peer went away and a
    worker died hard within CAUSE seconds: then that death (an engine SIGKILLed while a learner
    sends it weights fails the learner's send at once, and Ray records the engine's death after)."""
    ordered = sorted(workers, key=lambda w: (w.error is None, w.at or float("inf"), w.host, w.pid))
    first = ordered[0] if ordered else None
    if first is None or not first.error or not PEER_GONE.search(first.error):
        return ordered
    for i, w in enumerate(ordered):
        if says_died(w.error) and (w.at is None or first.at is None or w.at - first.at <= CAUSE):
            return [w, *ordered[:i], *ordered[i + 1 :]]
    return ordered


def _gather_host(folder: Path, host: str, attempts: dict[str, int], out_dir: Path) -> list[WorkerLog]:
    workers: dict[tuple[str, int], dict[str, Path]] = {}
    for path in folder.iterdir():
        match = WORKER.match(path.name)
        if match:  # (its name's job id is often nil: Ray starts workers before giving them a job)
            workers.setdefault((match.group(1), int(match.group(3))), {})[match.group(4)] = path
    found = []
    for (wid, pid), files in sorted(workers.items(), key=lambda kv: kv[0][1]):
        first = min(files.values())
        job, _ = _markers(_read_start(first))
        if job not in attempts:
            continue
        texts = {kind: read_copy(path) for kind, path in sorted(files.items())}
        core = folder / CORE.format(wid=wid, pid=pid)
        if core.exists():
            texts["core.log"] = read_copy(core)
        _, actor = _markers(texts.get("err", "") + "\n" + texts.get("out", ""))
        worker = WorkerLog(host, actor, pid, job, attempts[job], wid)
        worker.error = first_error(texts.get("err", "")) or first_error(texts.get("out", ""))
        err_lines = texts.get("err", "").splitlines()
        worker.last_err = [ln.strip() for ln in err_lines if ln.strip() and not ln.startswith(MARKERS)][-5:]
        if worker.error:
            worker.at = min(_mtime(files.get(k)) for k in ("err", "out") if files.get(k))
        target = out_dir / host
        target.mkdir(parents=True, exist_ok=True)
        for kind, text in texts.items():
            name = f"{_safe(worker.actor)}-{pid}.{kind}"
            atomic_write(target / name, text)
            worker.files.append(f"{host}/{name}")
        found.append(worker)
    return found


def _read_start(path: Path, size: int = 4096) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(size).decode(errors="replace")
    except OSError:
        return ""


def _mtime(path: Path | None) -> float:
    with contextlib.suppress(OSError):
        return path.stat().st_mtime if path else float("inf")
    return float("inf")


def read_index(cluster: str, job_id: str) -> list[WorkerLog] | None:
    """The gathered workers of a job, None when they were never gathered."""
    try:
        rows = json.loads((paths.cluster(cluster).job_files(job_id) / INDEX).read_text())
    except (OSError, ValueError):
        return None
    return [WorkerLog(**row) for row in rows]


def summary(workers: list[WorkerLog]) -> str | None:
    """`node7 LearnerActor pid 4121: torch.OutOfMemoryError: ...` for the first error, if any; a
    death that broke a peer's connection adds `; then <the peer>: <its error>`."""
    first = next((w for w in workers if w.error), None)
    if first is None:
        return None
    then = workers[1] if says_died(first.error) and len(workers) > 1 else None
    if then is not None and then.error and PEER_GONE.search(then.error):  # (what its death did)
        return f"{first.label}: {first.error}; then {then.label}: {then.error}"
    return f"{first.label}: {first.error}"
