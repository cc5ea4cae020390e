"""Usage samples: every node program appends one line every SAMPLE_EVERY seconds to
usage/<allocation>-<host>.jsonl in the cluster folder (its own file: no lock, no contention).

A line: {"t": epoch, "cpu": node CPU %, "ours": cores used by this allocation's processes on
the node, "mem": bytes used, "mem_total": bytes, "gpus": [[util %, MiB used, MiB total], ...]}
and, from the head, "other_jobs": Ray jobs running that are not raystack's (plain `ray job
submit`, attached drivers), and "progress": {job: {host, n, moved, procs}} for the jobs the hang
watchdog watches (allocation/watchdog/progress.py: when a process of the job last moved on this node).
`raystack report` reads them, after `down` too. A sample costs a few milliseconds (psutil over
the node program's descendants, one nvidia-smi call where there are GPUs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from raystack.allocation.node.gpus import gpu_usage
from raystack.store import paths
from raystack.waiting import REAL, Clock, Every

log = logging.getLogger("raystack.node")
SAMPLE_EVERY = 10.0  # seconds between samples (RAYSTACK_SAMPLE_EVERY, read when a sampler starts)


def sample_every(env: Mapping[str, str] = os.environ) -> float:
    return float(env.get("RAYSTACK_SAMPLE_EVERY") or SAMPLE_EVERY)


class UsageSampler:
    """Called from the node program's loop; samples at most every `every` seconds. A failed write
    (a full shared filesystem) raises: the caller's guard logs it and backs off."""

    def __init__(
        self,
        cluster: str,
        alloc_id: str,
        host: str,
        every: float | None = None,
        clock: Clock = REAL,
        progress: Callable[[], dict[str, Any]] | None = None,
    ):
        self.progress = progress
        self.path = paths.cluster(cluster).usage_file(alloc_id, host)
        self.gate = Every(sample_every() if every is None else every, clock)
        self.procs: dict[int, psutil.Process] = {}
        self.job_of: dict[tuple[int, float], str | None] = {}  # (pid, started) -> RAYSTACK_JOB_ID
        self.extra: dict[str, Any] = {}  # the head's own figures (ray_jobs), set by its caller
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        psutil.cpu_percent(None)  # the first call only starts the count
        self.jobs: dict[str, list[float]] = {}
        self.ours()

    def ours(self) -> float:
        """Cores used since the last call by this node program's descendants (Ray, the jobs'
        workers and drivers, and orphans: we are their subreaper). Per raystack job too
        (`self.jobs`: id -> [cores, busiest process's cores, processes]), by the RAYSTACK_JOB_ID
        every process of a job inherits: what the queue runner's hang check reads."""
        seen: dict[int, psutil.Process] = {}
        percent = 0.0
        jobs: dict[str, list[float]] = {}
        for child in psutil.Process().children(recursive=True):
            proc = self.procs.get(child.pid, child)
            with contextlib.suppress(psutil.Error):
                used = proc.cpu_percent(None) / 100  # (0 on a process's first call)
                percent += used
                seen[child.pid] = proc
                job = self._job(proc)
                if job:
                    row = jobs.setdefault(job, [0.0, 0.0, 0])
                    row[0], row[1], row[2] = row[0] + used, max(row[1], used), row[2] + 1
        self.procs = seen
        self.jobs = {j: [round(r[0], 3), round(r[1], 3), int(r[2])] for j, r in jobs.items()}
        return percent

    def _job(self, proc: psutil.Process) -> str | None:
        key = (proc.pid, proc.create_time())
        if key not in self.job_of:
            try:
                self.job_of[key] = proc.environ().get("RAYSTACK_JOB_ID")
            except psutil.Error:
                self.job_of[key] = None
            if len(self.job_of) > 4 * max(len(self.procs), 256):  # (forget exited processes)
                self.job_of = {k: v for k, v in self.job_of.items() if k[0] in self.procs}
        return self.job_of[key]

    def sample(self) -> dict[str, Any]:
        mem = psutil.virtual_memory()
        ours = self.ours()
        return {
            "t": round(time.time(), 2),
            "cpu": psutil.cpu_percent(None),
            "ours": round(ours, 3),
            "mem": mem.total - mem.available,
            "mem_total": mem.total,
            "gpus": [list(g) for g in gpu_usage(self.visible)],
            **({"jobs": self.jobs} if self.jobs else {}),
            **({"progress": rows} if (rows := self.progress() if self.progress else None) else {}),
            **self.extra,
        }

    def __call__(self) -> None:
        if not self.gate():
            return
        line = json.dumps(self.sample(), separators=(",", ":"))
        with open(self.path, "a") as fh:
            fh.write(line + "\n")
