"""The cluster's first job starts as fast as the ones after it.

A fresh Ray cluster makes its first job pay what later jobs find ready: the dashboard's job module
and its first job supervisor actor, the runtime_env agent's first environment, the worker
processes the raylet starts once a first driver connects, and Ray's modules read from a cold
disk. Measured on a local cluster (2 CPUs): submit -> the entrypoint's first line 3.9 s for the
first job against 1.7-2.0 s for the next ones. So the head starts a process (not a thread: two
threads importing Ray's modules at once failed a start with a circular import) that submits one
throwaway job through the Jobs API while the worker nodes join and the interconnect canary runs;
READY waits for it (at most FINISH seconds more: a warm-up never fails a start). The job is
deleted from Ray's list once it ended. It also starts each node's SPMD launch host (launch/pool.py)
once the allocation's nodes are in Ray. Where there is nothing to overlap it with (one node without
GPUs: a local CPU cluster) it is left out, since it would only move READY later: there the Jobs
API answers last, and READY came 4-5 s later for a first job 0.6-1 s sooner. RAYSTACK_WARMUP=1 in
the environment of `raystack up` asks for it anyway, RAYSTACK_WARMUP=0 leaves it out.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from raystack.adapters.ray import Dashboard
from raystack.allocation.node.gpus import real_gpus
from raystack.allocation.runner.prepare import forget
from raystack.errors import RaystackError
from raystack.launch.process import die_with_parent
from raystack.waiting import REAL, Clock, poll_until

log = logging.getLogger("raystack.node")

PREFIX = "raystack-warmup-"  # (its submission id: the allocation's id follows)
# (it also starts each node's SPMD launch host, once the allocation's nodes are in: launch/pool.py)
ENTRYPOINT = "python -m raystack.launch.pool --nodes {nodes}"
START = 120.0  # seconds for the Jobs API to answer and the job to end
FINISH = 10.0  # seconds READY waits for it at most, once the cluster is otherwise ready


def overlaps(num_nodes: int, gpus: int) -> bool:
    """Whether a warm-up has something to run beside: worker nodes joining, or the interconnect
    canary (real GPUs)."""
    return num_nodes > 1 or (gpus > 0 and real_gpus())


class Warmup:
    """One throwaway job through the Jobs API: submitted once the API answers, waited for, then
    deleted from Ray's list. Says one line when it ended (or why it did not run) through `say`."""

    def __init__(
        self,
        cluster: str,
        url: str,
        alloc_id: str,
        clock: Clock = REAL,
        say: Callable[[str], None] = print,
        nodes: int = 1,
    ):
        self.cluster, self.url, self.clock, self.say, self.nodes = cluster, url, clock, say, nodes
        self.submission_id = f"{PREFIX}{alloc_id}"

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            dashboard = Dashboard.of(self.cluster, self.url)
            poll_until(lambda: dashboard.probe() is None, START, "the Jobs API", self.clock, max_interval=0.5)
            entrypoint = ENTRYPOINT.format(nodes=self.nodes)
            dashboard.submit(self.submission_id, entrypoint, {"env_vars": {"RAYSTACK_WARMUP": "1"}})
            status = poll_until(lambda: self.ended(dashboard), START, "the warm-up job", self.clock)
            self.say(f"{status} in {time.monotonic() - t0:.1f}s")
            forget(dashboard, self.submission_id, self.clock)
        except (RaystackError, RuntimeError, OSError) as exc:
            self.say(f"skipped: {str(exc)[:300]}")

    def ended(self, dashboard: Dashboard) -> str | None:
        info = dashboard.info(self.submission_id)
        return str(info.status) if info is not None and info.status.is_terminal() else None


class Started:
    """The head's side: the warm-up process (None where it was left out, `why`)."""

    def __init__(self, proc: subprocess.Popen[str] | None, why: str | None = None):
        self.proc, self.why = proc, why

    def finish(self, timeout: float = FINISH) -> str:
        """Wait for its line (before READY), at most `timeout` seconds; what happened."""
        if self.proc is None or self.proc.stdout is None:
            outcome = f"left out: {self.why}"
        elif select.select([self.proc.stdout], [], [], timeout)[0]:
            outcome = self.proc.stdout.readline().strip() or f"ended without a word (exit {self.proc.poll()})"
        else:
            outcome = f"still running after {timeout:.0f}s: READY without it"
        log.info("warm-up job %s", outcome)
        return outcome


def launch(
    cluster: str, url: str, alloc_id: str, overlaps: bool, env: Mapping[str, str] = os.environ, nodes: int = 1
) -> Started:
    """Start the warm-up (RAYSTACK_WARMUP: auto, 1 or 0) in a process of its own."""
    mode = env.get("RAYSTACK_WARMUP", "auto")
    if mode == "0" or (mode == "auto" and not overlaps):
        return Started(None, "RAYSTACK_WARMUP=0" if mode == "0" else "nothing to overlap (one node, no GPUs)")
    argv = [sys.executable, "-m", "raystack.allocation.head.warmup", cluster, url, alloc_id, str(nodes)]
    pipe = subprocess.PIPE
    return Started(subprocess.Popen(argv, env=dict(env), stdout=pipe, text=True, preexec_fn=die_with_parent))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    cluster, url, alloc_id, nodes = sys.argv[1:5]
    Warmup(cluster, url, alloc_id, say=lambda line: print(line, flush=True), nodes=int(nodes)).run()
