"""The cluster's first job starts as fast as the ones after it.

A fresh Ray cluster makes its first job pay what later jobs find ready: the dashboard's job module
and its first job supervisor actor, the runtime_env agent's first environment, the worker
processes the raylet starts once a first driver connects, and Ray's modules read from a cold
disk. Measured on a local cluster (2 CPUs): submit -> the entrypoint's first line 3.9 s for the
first job against 1.7-2.0 s for the next ones. So the head submits one throwaway job through the
Jobs API while the worker nodes join and the interconnect canary runs, and waits for it before
READY (at most FINISH seconds more: a warm-up never fails a start). The job is deleted from Ray's
list once it ended. Where there is nothing to overlap it with (one node without GPUs: a local CPU
cluster) it is left out, since it would only move READY later: there the Jobs API answers last,
and READY came 4-5 s later for a first job 0.6-1 s sooner. RAYSTACK_WARMUP=1 in the environment
of `raystack up` asks for it anyway, RAYSTACK_WARMUP=0 leaves it out.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from raystack.adapters.ray import Dashboard
from raystack.allocation.gpus import real_gpus
from raystack.errors import RaystackError
from raystack.waiting import REAL, Clock, poll_until

log = logging.getLogger("raystack.node")

PREFIX = "raystack-warmup-"  # (its submission id: the allocation's id follows)
ENTRYPOINT = "python -c 'import ray; ray.init(); ray.shutdown()'"
START = 120.0  # seconds for the Jobs API to answer and the job to end
DELETE_AFTER = 3.0  # seconds after its end (and between tries) before it is deleted from Ray's list
FINISH = 10.0  # seconds READY waits for it at most, once the cluster is otherwise ready


def overlaps(num_nodes: int, gpus: int) -> bool:
    """Whether a warm-up has something to run beside: worker nodes joining, or the interconnect
    canary (real GPUs)."""
    return num_nodes > 1 or (gpus > 0 and real_gpus())


class Warmup:
    """One throwaway job through the Jobs API, in a thread of its own."""

    def __init__(self, cluster: str, url: str, alloc_id: str, overlaps: bool = True, clock: Clock = REAL):
        self.cluster, self.url, self.clock, self.overlaps = cluster, url, clock, overlaps
        self.submission_id = f"{PREFIX}{alloc_id}"
        self.took: float | None = None  # seconds, once it ended
        self.why: str | None = None  # why it did not run
        self.done = threading.Event()  # (it ended, or will not run)
        self.thread = threading.Thread(target=self.run, name="warm-up", daemon=True)

    def start(self) -> Warmup:
        self.thread.start()
        return self

    def run(self) -> None:
        t0 = time.monotonic()
        mode = os.environ.get("RAYSTACK_WARMUP", "auto")
        if mode == "0" or (mode == "auto" and not self.overlaps):
            self.why = "RAYSTACK_WARMUP=0" if mode == "0" else "nothing to overlap (one node, no GPUs)"
            log.info("warm-up job left out: %s", self.why)
            return
        try:
            dashboard = Dashboard.of(self.cluster, self.url)  # (its own: the head's is in use)
            poll_until(lambda: dashboard.probe() is None, START, "the Jobs API", self.clock, max_interval=0.5)
            dashboard.submit(self.submission_id, ENTRYPOINT, {"env_vars": {"RAYSTACK_WARMUP": "1"}})
            status = poll_until(lambda: self.ended(dashboard), START, "the warm-up job", self.clock)
            self.took = time.monotonic() - t0
            log.info("warm-up job %s in %.1fs", status, self.took)
            self.done.set()
            self.forget(dashboard)
        except (RaystackError, RuntimeError, OSError) as exc:
            self.why = str(exc)[:300]
            log.info("warm-up job skipped: %s", self.why)
        finally:
            self.done.set()

    def forget(self, dashboard: Dashboard) -> None:
        """Delete the job from Ray's list once Ray's job manager has stopped watching it: deleted
        at once, its monitor finds the supervisor gone and writes the job back as FAILED."""
        for _ in range(3):
            self.clock.sleep(DELETE_AFTER)
            if dashboard.info(self.submission_id) is None:
                return
            dashboard.jobs.delete_job(self.submission_id)

    def ended(self, dashboard: Dashboard) -> str | None:
        info = dashboard.info(self.submission_id)
        return str(info.status) if info is not None and info.status.is_terminal() else None

    def finish(self, timeout: float = FINISH) -> None:
        """Wait for it (before READY), at most `timeout` seconds."""
        if not self.done.wait(timeout):
            log.info("warm-up job still running after %.0fs: READY without it", timeout)
