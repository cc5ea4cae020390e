"""Periodic duties of every node program's loop: reaping orphans, the GPU report, the head's
heartbeat and its watch on the cluster folder. Each runs on the clock it is given (tests drive a
FakeClock)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from raystack.allocation.node.context import BEAT, BEAT_BYTES, GPU_REFRESH, NodeContext
from raystack.allocation.node.gpus import CHECK_EVERY, gpu_processes, real_gpus, source
from raystack.errors import NoSuchCluster, RaystackError
from raystack.store import cluster as records
from raystack.store import node_entries, paths
from raystack.store.ledger import read_job
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

    The GPUs are asked every `every` seconds (gpus.CHECK_EVERY: 0.25 s through NVML, 1 s through
    nvidia-smi); the entry is written only when what they report changed, or every `refresh`
    seconds: N nodes cost the shared filesystem N/refresh writes per second, and nothing is read
    (the node keeps its own entry in memory). The entry says how often the node asks
    (`gpu_every`): the runner waits that long after a job's end for a node that saw no change."""

    def __init__(
        self, ctx: NodeContext, every: float | None = None, refresh: float = GPU_REFRESH, clock: Clock = REAL
    ):
        self.ctx, self.clock = ctx, clock
        self.every = every if every is not None else CHECK_EVERY[source() or "nvidia-smi"]
        self.gate, self.refresh = Every(self.every, clock), refresh
        self.reported: list[tuple[int, int]] | None = None
        self.written = -float("inf")
        self.ended: dict[str, bool] = {}  # job id -> whether it has ended (a leftover's job)

    def __call__(self) -> None:
        if not self.ctx.gpus or not real_gpus() or not self.gate():
            return
        procs = gpu_processes()
        if procs and end_leftovers(self.ctx.cluster, [pid for pid, _ in procs], self.ended):
            procs = gpu_processes()
        if procs == self.reported and self.clock.now() - self.written < self.refresh:
            return
        self.ctx.entry.update(gpu_procs=procs, gpu_checked=time.time(), gpu_every=self.every)
        node_entries.write_node_entry(self.ctx.cluster, self.ctx.host, self.ctx.entry)
        self.reported, self.written = procs, self.clock.now()


def end_leftovers(cluster: str, holders: list[int], ended: dict[str, bool]) -> int:
    """Kill the processes holding GPU memory that a job left behind: orphans (their parent died,
    so this node program, their subreaper, adopted them) of a job that has ended, with what they
    started. vLLM's engine core outlives an engine actor that was SIGKILLed and keeps its GPU
    memory; the next job would wait for it until the queue's free timeout. Ray's own workers
    (children of the raylet; a detached actor's too) are never touched. How many were killed."""
    import psutil

    me, killed = os.getpid(), 0
    for pid in holders:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            job = proc.environ().get("RAYSTACK_JOB_ID")
            if proc.ppid() != me or not job:
                continue
            if not ended.get(job):  # (an ended job stays ended: only that is kept)
                ended[job] = job_ended(cluster, job)
            if not ended[job]:
                continue
            tree = [proc, *proc.children(recursive=True)]
            log.warning(
                "job %s ended; its leftover %s (pid %d, holding GPU memory) and %d process(es) it "
                "started are killed",
                *(job, proc.name(), pid, len(tree) - 1),
            )
            for one in tree:
                with contextlib.suppress(psutil.Error):
                    one.kill()
            killed += 1
    return killed


def job_ended(cluster: str, job_id: str) -> bool:
    """Whether the ledger says job `job_id` has ended (unreadable or unknown: not)."""
    try:
        return read_job(cluster, job_id).state.is_terminal()
    except RaystackError:
        return False


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


class FolderWatch:
    """Whether the cluster folder is still there. Removed while the cluster runs (by hand, by a
    scratch filesystem's purge), its record and token are gone: no raystack command finds the
    cluster, nothing can reach or stop it, and the allocation would hold its nodes until the
    walltime. Missing at every look for `grace` seconds (one failed look may be a filesystem
    hiccup), it says why the allocation ends. `follow_on`: the pending next allocation of the
    chain as the record last named it (it would start only to fail: its folder is gone too)."""

    def __init__(self, ctx: NodeContext, grace: float, every: float = 15.0, clock: Clock = REAL):
        self.ctx, self.grace, self.clock = ctx, grace, clock
        self.gate = Every(min(every, max(grace / 2, 1.0)), clock)  # (at least two looks per grace)
        self.missing_since: float | None = None
        self.follow_on: str | None = None

    def __call__(self) -> str | None:
        if not self.gate():
            return None
        now = self.clock.now()
        try:  # (a record that cannot be read raises: that is no removal)
            self.follow_on = records.read(self.ctx.cluster).next_allocation_id
            self.missing_since = None
            return None
        except NoSuchCluster:
            self.missing_since = self.missing_since or now
        if now - self.missing_since < self.grace:
            return None
        also = ""
        if self.follow_on:
            with contextlib.suppress(RaystackError):
                self.ctx.allocator.cancel(self.follow_on)
            also = f"; its follow-on {self.follow_on} is cancelled"
        return (
            f"the cluster folder {paths.cluster(self.ctx.cluster).root} has been gone for "
            f"{now - self.missing_since:.0f}s (removed by hand or by a scratch purge): nothing can "
            "reach this cluster any more (its token went with it), so the allocation ends instead of "
            f"holding its nodes until the walltime{also}"
        )
