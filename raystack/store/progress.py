"""Which jobs the nodes watch for progress (their processes' Python stacks), asked through the
cluster folder by the queue runner's hang watchdog (allocation/watchdog/verdict.py) and answered by every
node program in its usage samples (allocation/watchdog/progress.py).

    logs/progress.request    {job id: seconds between two stack samples}: written whole by the
                             queue runner when the set of jobs in flight with a hang_timeout
                             changes; every node program looks at it (one stat) every few seconds
"""

from __future__ import annotations

import json
from pathlib import Path

from raystack.store import paths
from raystack.store.files import atomic_write

REQUEST = "progress.request"


def request_file(cluster: str) -> Path:
    return paths.cluster(cluster).logs / REQUEST


def watched(cluster: str) -> dict[str, float]:
    """The jobs to sample, with the seconds between two samples of each ({} when none or unreadable)."""
    try:
        data = json.loads(request_file(cluster).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    found = {}
    for job, every in data.items():
        if isinstance(every, int | float) and every > 0:
            found[str(job)] = float(every)
    return found


def watch(cluster: str, jobs: dict[str, float]) -> None:
    """Ask every node to sample exactly these jobs (the queue runner is the only writer)."""
    atomic_write(request_file(cluster), json.dumps(jobs, sort_keys=True))
