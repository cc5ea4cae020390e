"""What keeps a cluster folder from growing without bound (profile `folder_cap`).

Each allocation adds copies of Ray's logs (capped per node: store/raylogs.py) and usage samples;
each job adds its driver log (capped: allocation/runner/logtail.py) and its gathered worker logs. A
chain of allocations that runs for weeks would fill a quota, so the head prunes at its start
and every hour: the oldest earlier allocation's copies of Ray's logs go first, then its usage
samples and Prometheus log, then the gathered worker logs of the jobs that ended longest ago.
The ledger, the queue and the jobs' driver logs are never pruned (they are what the user asked
raystack to keep); if they alone exceed the cap, the head says so in its log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.ledger import recently_finished

GB = 1 << 30
DEFAULT_CAP = 8 * GB


def tree_size(path: Path) -> int:
    """Bytes in the files under `path` (links not followed; vanishing files skipped)."""
    total = 0
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def candidates(name: str, current: str | None) -> list[Path]:
    """What may be pruned, first to go first: per earlier allocation (oldest first) its Ray log
    copies, usage samples and Prometheus log; then gathered worker logs, oldest job first."""
    p = paths.cluster(name)
    older: dict[str, list[Path]] = {}
    for host in _dirs(p.ray_logs):
        for sub in _dirs(host):
            if sub.name != current:
                older.setdefault(sub.name, []).append(sub)
    known = _allocations(name)
    for sample in _files(p.usage):
        alloc = next((a for a in known if sample.name.startswith(f"{a}-")), None)
        if alloc and alloc != current:
            older.setdefault(alloc, []).append(sample)
    for log in _files(p.logs):
        if log.name.startswith("prometheus-") and log.name != f"prometheus-{current}.log":
            older.setdefault(log.name.removeprefix("prometheus-").removesuffix(".log"), []).append(log)
    order = sorted(older, key=lambda a: min(_mtime(x) for x in older[a]))
    found = [x for alloc in order for x in older[alloc]]
    finished = recently_finished(name, 1 << 30)  # oldest first
    found += [p.job_files(j) for j in finished if p.job_files(j).is_dir()]
    return found


def prune(name: str, current: str | None, cap: int | None) -> list[str]:
    """Remove the oldest prunable parts until the folder is under `cap` bytes; what was removed."""
    if not cap:
        return []
    p = paths.cluster(name)
    size = tree_size(p.root)
    removed: list[str] = []
    for path in candidates(name, current) if size > cap else []:
        if size <= cap:
            break
        freed = tree_size(path) if path.is_dir() else _size(path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        size -= freed
        removed.append(f"{path.relative_to(p.root)} ({freed / 2**20:.1f} MB)")
    return removed


def _allocations(name: str) -> list[str]:
    """The allocations the record knows (longest first: `12` must not claim `123-node1.jsonl`)."""
    try:
        ids = [a.alloc_id for a in records.read(name).allocations]
    except Exception:
        return []
    return sorted(set(ids), key=len, reverse=True)


def _dirs(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _files(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
