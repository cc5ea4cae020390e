"""Usage samples: every node program appends one line every SAMPLE_EVERY seconds to
usage/<allocation>-<host>.jsonl in the cluster folder (its own file: no lock, no contention).

A line: {"t": epoch, "cpu": node CPU %, "ours": cores used by this allocation's processes on
the node, "mem": bytes used, "mem_total": bytes, "gpus": [[util %, MiB used, MiB total], ...]}
and, from the head, "other_jobs": Ray jobs running that are not raystack's (plain `ray job
submit`, attached drivers).
`raystack report` reads them, after `down` too. A sample costs a few milliseconds (psutil over
the node program's descendants, one nvidia-smi call where there are GPUs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any

import psutil

from raystack.allocation.rayproc import gpu_usage
from raystack.store import paths

log = logging.getLogger("raystack.node")
SAMPLE_EVERY = float(os.environ.get("RAYSTACK_SAMPLE_EVERY") or 10)


class UsageSampler:
    """Called from the node program's loop; samples at most every `every` seconds."""

    def __init__(self, cluster: str, job_id: str, host: str, every: float = SAMPLE_EVERY):
        self.path = paths.cluster(cluster).usage_file(job_id, host)
        self.every, self.last = every, 0.0
        self.procs: dict[int, psutil.Process] = {}
        self.extra: dict[str, Any] = {}  # the head's own figures (ray_jobs), set by its caller
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        psutil.cpu_percent(None)  # the first call only starts the count
        self.ours()

    def ours(self) -> float:
        """Cores used since the last call by this node program's descendants (Ray, the jobs'
        workers and drivers, and orphans: we are their subreaper)."""
        seen: dict[int, psutil.Process] = {}
        percent = 0.0
        for child in psutil.Process().children(recursive=True):
            proc = self.procs.get(child.pid, child)
            with contextlib.suppress(psutil.Error):
                percent += proc.cpu_percent(None)  # (0 on a process's first call)
                seen[child.pid] = proc
        self.procs = seen
        return percent / 100

    def sample(self) -> dict[str, Any]:
        mem = psutil.virtual_memory()
        return {
            "t": round(time.time(), 2),
            "cpu": psutil.cpu_percent(None),
            "ours": round(self.ours(), 3),
            "mem": mem.total - mem.available,
            "mem_total": mem.total,
            "gpus": [list(g) for g in gpu_usage(self.visible)],
            **self.extra,
        }

    def __call__(self) -> None:
        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        try:
            line = json.dumps(self.sample(), separators=(",", ":"))
            with open(self.path, "a") as fh:
                fh.write(line + "\n")
        except OSError as exc:  # a full or unreachable shared filesystem must not end the node
            log.warning("usage sample not written to %s: %s", self.path, exc)


def read_samples(path: os.PathLike[str] | str) -> list[dict[str, Any]]:
    """The samples of one file, oldest first; a torn last line (node killed mid-write) skipped."""
    samples = []
    try:
        with open(path) as fh:
            for line in fh:
                with contextlib.suppress(ValueError):
                    sample = json.loads(line)
                    if isinstance(sample, dict) and isinstance(sample.get("t"), int | float):
                        samples.append(sample)
    except FileNotFoundError:
        return []
    return samples
