"""Periodic duties of every node program's loop: reaping orphans, the GPU report and the head's
heartbeat. Each runs on the clock it is given (tests drive a FakeClock)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from raystack.allocation.context import BEAT, BEAT_BYTES, GPU_REFRESH, NodeContext
from raystack.allocation.rayproc import gpu_processes, has_nvidia_smi
from raystack.store import cluster as records
from raystack.store import paths
from raystack.waiting import REAL, Clock, Every

log = logging.getLogger("raystack.node")


class Reaper:
    """Reaps orphaned processes that died (we are their subreaper), except the ones a Popen owns.

    Without it every Ray worker that exits leaves a zombie until teardown.
    """

    def __init__(self, every: float = 2.0, clock: Clock = REAL):
        self.gate = Every(every, clock)
        self.owned: set[int] = set()  # pids whose exit status a Popen object collects itself

    def __call__(self) -> int:
        if not self.gate():
            return 0
        import psutil

        reaped = 0
        for child in psutil.Process().children():
            if child.pid in self.owned:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
                    reaped += 1
        return reaped


class GpuReport:
    """Publishes this node's leftover GPU memory in its node entry (read by the queue runner).

    nvidia-smi is asked every `every` seconds; the entry is written only when what it reports
    changed, or every `refresh` seconds: N nodes cost the shared filesystem N/refresh writes per
    second, and nothing is read (the node keeps its own entry in memory)."""

    def __init__(
        self, ctx: NodeContext, every: float = 1.0, refresh: float = GPU_REFRESH, clock: Clock = REAL
    ):
        self.ctx, self.clock = ctx, clock
        self.gate, self.refresh = Every(every, clock), refresh
        self.reported: list[tuple[int, int]] | None = None
        self.written = -float("inf")

    def __call__(self) -> None:
        if not self.ctx.gpus or not has_nvidia_smi() or not self.gate():
            return
        procs = gpu_processes()
        if procs == self.reported and self.clock.now() - self.written < self.refresh:
            return
        self.ctx.entry.update(gpu_procs=procs, gpu_checked=time.time())
        records.write_node_entry(self.ctx.cluster, self.ctx.host, self.ctx.entry)
        self.reported, self.written = procs, self.clock.now()


class Heartbeat:
    """The head's sign of life: a small file rewritten in place every BEAT seconds. Workers watch
    it beside the GCS port, and `raystack status` shows a head whose beat is stale as DEGRADED.

    Written with pwrite over the same bytes (no new file, no truncation): a full quota or a full
    disk on the shared filesystem does not stop it, since no new block is needed."""

    def __init__(self, ctx: NodeContext, clock: Clock = REAL, every: float = BEAT):
        self.path = paths.cluster(ctx.cluster).heartbeat
        self.ctx, self.gate, self.count = ctx, Every(every, clock), 0

    def __call__(self) -> None:
        if not self.gate():
            return
        self.count += 1
        beat = {"allocation": self.ctx.alloc_id, "host": self.ctx.host, "pid": os.getpid(), "n": self.count}
        text = json.dumps({**beat, "t": round(time.time(), 3)}).encode().ljust(BEAT_BYTES)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, text[:BEAT_BYTES], 0)
        finally:
            os.close(fd)
