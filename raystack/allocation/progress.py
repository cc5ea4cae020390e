"""Progress of the jobs the queue runner watches for hangs (store/progress.py): every node program
samples the Python stacks of each watched job's processes on its node (`py-spy dump --json`) and
says in its usage samples when it last saw one of them move. The watchdog (watchdog.py) calls a
job hung when no process of it moved on any node, and it printed nothing, for `hang_timeout`.

Busy is not progress: a rank spinning in an NCCL collective whose peer never comes shows 100 % of
its GPU and a full CPU core, with the same stack sample after sample. What counts as moving:
- a thread running (on a CPU, not asleep on a lock, a socket, a GPU event or in time.sleep) at two
  samples in a row whose stack differs between them: other functions, or other values of their
  variables (`py-spy dump --locals`: a loop's counter, the item it works on, an accumulator). A
  training step, an evaluation in a numpy loop, a vLLM engine generating all move; a thread that
  polls in place (`while not work.is_completed(): pass`) runs on the same variables and does not.
  Line numbers alone count only in a script's top level, where py-spy shows no variables. A poll
  loop caught awake once between two sleeps is not moving either: it must run at both samples.
- a process of the job that started, or ended, since the sample before.
- a process py-spy cannot read (not Python, ptrace refused) that used CPU since the sample before:
  nothing better is known of it.
A job whose processes all sleep (every rank waits in a gloo collective, a driver waits on an actor
that waits on nothing) does not move either.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psutil

from raystack.allocation.stacks import job_processes, py_spy
from raystack.store import progress as store
from raystack.waiting import REAL, Clock, Every

log = logging.getLogger("raystack.node")
LOOK_EVERY = 2.0  # seconds between looks at the request file (one stat)
SPY_TIMEOUT = 10.0  # seconds one py-spy dump may take
OPAQUE_CPU = 0.05  # CPU seconds per sample that make a process py-spy cannot read count as moving
Stack = tuple[tuple[str, str, object], ...]  # (function, file, its variables' values or its line)
Stacks = dict[int, Stack]  # thread id -> stack, of the threads that were running


@dataclass
class Seen:
    """One process at its last sample."""

    running: Stacks  # the stacks of its threads that were running (empty: all asleep)
    readable: bool
    cpu: float  # CPU seconds used so far


@dataclass
class JobProgress:
    """What this node knows of one watched job."""

    every: float
    due: float = 0.0  # (clock) when to sample next
    samples: int = 0
    moved: float = 0.0  # (wall) when a process last moved; 0: never seen moving
    procs: int = 0
    opaque: int = 0  # processes py-spy could not read at the last sample
    error: str | None = None
    seen: dict[tuple[int, float], Seen] = field(default_factory=dict)

    def row(self, host: str) -> dict[str, Any]:
        row: dict[str, Any] = {"host": host, "n": self.samples, "moved": self.moved, "procs": self.procs}
        if self.opaque:
            row["opaque"] = self.opaque
        if self.error:
            row["error"] = self.error
        return row


def frame_key(frame: dict[str, Any]) -> tuple[str, str, object]:
    """A frame as progress sees it: its function and file, with its variables' values where py-spy
    gives them (else, at a script's top level, its line)."""
    names = frame.get("locals")
    if names:
        state: object = tuple((str(v.get("name")), str(v.get("repr"))) for v in names)
    else:
        state = int(frame.get("line") or 0)
    return (str(frame.get("name")), str(frame.get("filename")), state)


def running_stacks(dump: list[dict[str, Any]]) -> Stacks:
    """The stacks of the threads of one `py-spy dump --json --locals` that were running (not idle)."""
    return {
        int(t.get("thread_id") or 0): tuple(frame_key(f) for f in t.get("frames") or [])
        for t in dump
        if t.get("active")
    }


def moved(before: Seen | None, now: Seen) -> bool:
    """Whether one process moved between two samples (the rules in this module's docstring)."""
    if before is None:
        return False  # (a new process: the caller counts its start)
    if not now.readable or not before.readable:
        return now.cpu - before.cpu >= OPAQUE_CPU
    return any(before.running[t] != stack for t, stack in now.running.items() if t in before.running)


def spy(proc: psutil.Process, exe: str) -> Seen:
    """One sample of one process: its running threads' stacks, or unreadable (with its CPU time)."""
    try:
        times = proc.cpu_times()
        cpu = times.user + times.system
    except psutil.Error:
        cpu = 0.0
    try:
        out = subprocess.run(
            [exe, "dump", "--json", "--locals", "--pid", str(proc.pid)],
            capture_output=True,
            text=True,
            timeout=SPY_TIMEOUT,
        )
        if out.returncode == 0:
            return Seen(running_stacks(json.loads(out.stdout)), True, cpu)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass
    return Seen({}, False, cpu)


class ProgressProbe:
    """A duty of the node program's loop: samples the watched jobs' processes on its own thread
    (py-spy takes tens of milliseconds a process) and keeps a row per job for the usage samples."""

    def __init__(self, cluster: str, host: str, clock: Clock = REAL, look_every: float = LOOK_EVERY):
        self.cluster, self.host, self.clock = cluster, host, clock
        self.gate = Every(look_every, clock)
        self.path = store.request_file(cluster)
        self.mtime = -1.0
        self.jobs: dict[str, JobProgress] = {}
        self.lock = threading.Lock()
        self.busy: threading.Thread | None = None

    def rows(self) -> dict[str, dict[str, Any]]:
        """{job id: {host, n, moved, procs, ...}} for the usage sample ({} when nothing is watched)."""
        with self.lock:
            return {job: p.row(self.host) for job, p in self.jobs.items()}

    def _read_request(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            mtime = 0.0
        if mtime == self.mtime:
            return
        self.mtime = mtime
        wanted = store.watched(self.cluster)
        with self.lock:
            for job in [j for j in self.jobs if j not in wanted]:
                del self.jobs[job]
            for job, every in wanted.items():
                if job in self.jobs:
                    self.jobs[job].every = every
                else:
                    self.jobs[job] = JobProgress(every)

    def __call__(self) -> None:
        if not self.gate() or (self.busy is not None and self.busy.is_alive()):
            return
        self._read_request()
        now = self.clock.now()
        with self.lock:
            due = [job for job, p in self.jobs.items() if p.due <= now]
        if not due:
            return
        self.busy = threading.Thread(target=self._sample_all, args=(due,), name="progress", daemon=True)
        self.busy.start()

    def _sample_all(self, jobs: list[str]) -> None:
        for job in jobs:
            try:
                self.sample(job)
            except Exception as exc:  # (a vanished process, a full /proc: the next sample)
                log.warning("progress of job %s not sampled: %s", job, exc)

    def sample(self, job: str) -> None:
        """One sample of every process of `job` on this node; records whether any moved."""
        exe = py_spy()
        with self.lock:
            p = self.jobs.get(job)
        if p is None:
            return
        p.due = self.clock.now() + p.every
        if exe is None:
            p.error, p.samples = "py-spy not found: progress unknown (CPU use counts)", p.samples + 1
            return
        procs = job_processes(job)
        with ThreadPoolExecutor(max_workers=4) as pool:
            found = list(pool.map(lambda proc: (key_of(proc), spy(proc, exe)), procs))
        now = {key: seen for key, seen in found if key is not None}
        started = [k for k in now if k not in p.seen]
        ended = [k for k in p.seen if k not in now]
        moving = [k for k, seen in now.items() if moved(p.seen.get(k), seen)]
        with self.lock:
            if p.samples and (started or ended or moving):
                p.moved = time.time()
            p.seen, p.procs, p.samples = now, len(now), p.samples + 1
            p.opaque = sum(1 for s in now.values() if not s.readable)


def key_of(proc: psutil.Process) -> tuple[int, float] | None:
    try:
        return (proc.pid, proc.create_time())
    except psutil.Error:
        return None
