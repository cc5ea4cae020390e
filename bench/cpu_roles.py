"""Where a machine's CPU went in a window of time, by the role of each process.

On the 2-core testbed every node shares the same cores, so a launch's wall time is mostly the
CPU work of everything that runs meanwhile. A `Sampler` reads every process's CPU time and
command line (psutil) a few times a second in a thread of its own; `window(t0, t1)` gives the
core-seconds each role used between two moments, from the samples around them (a process that
started and ended between two samples is missed: a shell, a short `ray` call). A process's role
is the label of the first pattern its latest command line contains (after an exec, the new one).

    with Sampler() as cpu:
        t0 = time.time(); run(); t1 = time.time()
    cpu.window(t0, t1)  # {"ranks": 14.4, "Ray: job supervisor": 1.2, ...}
"""

from __future__ import annotations

import bisect
import collections
import statistics
import threading
import time
from collections.abc import Sequence

import psutil

# (pattern in the command line, role): the first match wins
ROLES: tuple[tuple[str, str], ...] = (
    ("raystack.launch.spmd", "raystack: the job's driver"),
    ("ray::LaunchHost", "raystack: launch hosts"),
    ("raystack.allocation.runner", "raystack: queue runner"),
    ("raystack.allocation", "raystack: node programs"),
    ("ray::JobSupervisor", "Ray: job supervisor"),
    ("bin/torchrun", "torchrun agents"),
    ("torch.distributed.run", "torchrun agents"),
    ("gcs_server", "Ray: GCS, raylets, dashboard, agents"),
    ("raylet", "Ray: GCS, raylets, dashboard, agents"),
    ("dashboard", "Ray: GCS, raylets, dashboard, agents"),
    ("ray::DashboardAgent", "Ray: GCS, raylets, dashboard, agents"),
    ("ray::RuntimeEnvAgent", "Ray: GCS, raylets, dashboard, agents"),
    ("log_monitor", "Ray: GCS, raylets, dashboard, agents"),
    ("autoscaler", "Ray: GCS, raylets, dashboard, agents"),
    ("ray start", "Ray: GCS, raylets, dashboard, agents"),
    ("ray::IDLE", "Ray: other workers"),
    ("default_worker.py", "Ray: other workers"),
    ("setup_worker.py", "Ray: other workers"),
    ("slurm", "SLURM (slurmd, slurmstepd, srun)"),
    ("srun", "SLURM (slurmd, slurmstepd, srun)"),
)


class Sampler:
    """Every process's CPU time, every `every` seconds, until `stop` (or the `with` ends)."""

    def __init__(
        self,
        every: float = 0.25,
        roles: Sequence[tuple[str, str]] = ROLES,
        extra: Sequence[tuple[str, str]] = (),  # (looked at before `roles`)
    ):
        self.every, self.roles = every, (*extra, *roles)
        self.times: list[float] = []
        self.cpu: list[dict[int, float]] = []
        self.cmdline: dict[int, str] = {}
        self.me = psutil.Process().pid
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sampling, after one last sample (a window that ends now has its closing one)."""
        self.done.set()
        self.thread.join()
        self.sample()

    def _run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.every)

    def sample(self) -> None:
        now, seen = time.time(), {}
        for proc in psutil.process_iter(["cmdline", "cpu_times"]):
            times, words = proc.info["cpu_times"], proc.info["cmdline"]
            if times is None:
                continue
            seen[proc.pid] = times.user + times.system
            if words:
                self.cmdline[proc.pid] = " ".join(words)
        self.times.append(now)
        self.cpu.append(seen)

    def role(self, pid: int) -> str:
        if pid == self.me:
            return "the benchmark (and this sampler)"
        words = self.cmdline.get(pid, "")
        return next((label for pattern, label in self.roles if pattern in words), "other")

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """Core-seconds of each role from the last sample before `t0` to the first after `t1`."""
        first = max(bisect.bisect_right(self.times, t0) - 1, 0)
        last = min(bisect.bisect_left(self.times, t1), len(self.times) - 1)
        before, end = self.cpu[first], {}
        for sample in self.cpu[first + 1 : last + 1]:  # (a process that ended: its last reading)
            end.update(sample)
        used: dict[str, float] = collections.Counter()
        for pid, cpu in end.items():
            spent = cpu - before.get(pid, 0.0)
            if spent > 0:
                used[self.role(pid)] += spent
        return {k: round(v, 3) for k, v in sorted(used.items(), key=lambda kv: -kv[1])}


def table(arms: dict[str, list[dict[str, float]]], walls: dict[str, list[float]]) -> list[str]:
    """Medians of each role's core-seconds per arm, a row per role, the total and the busy cores."""
    names = list(arms)
    roles = sorted(
        {r for runs in arms.values() for run in runs for r in run},
        key=lambda r: -max(statistics.median(run.get(r, 0.0) for run in arms[a]) for a in names),
    )
    width = max(len(r) for r in [*roles, "busy cores (total / wall)"])
    lines = [f"{'core-seconds, medians':{width}} " + " ".join(f"{a:>10}" for a in names)]
    for r in roles:
        meds = [statistics.median(run.get(r, 0.0) for run in arms[a]) for a in names]
        if max(meds) >= 0.05:
            lines.append(f"{r:{width}} " + " ".join(f"{m:>10.2f}" for m in meds))
    totals = [statistics.median(sum(run.values()) for run in arms[a]) for a in names]
    lines.append(f"{'total':{width}} " + " ".join(f"{t:>10.2f}" for t in totals))
    busy = [t / statistics.median(walls[a]) for t, a in zip(totals, names, strict=True)]
    lines.append(f"{'busy cores (total / wall)':{width}} " + " ".join(f"{b:>10.2f}" for b in busy))
    return lines
