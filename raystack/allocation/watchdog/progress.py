"""Progress of the jobs the queue runner watches for hangs (store/progress.py): every node program
looks at each watched job's processes on its node every hang_timeout/6 seconds (1 to 30 s) and says
in its usage samples when it last saw the job move, and by what evidence (what it reads of a
process: reading.py). The watchdog (verdict.py) calls a job hung when it printed nothing and moved
on no node for `hang_timeout`.

Busy is not progress: a rank whose NCCL peer never comes spins at 100 % of its GPU and a full CPU
core forever. Waiting is not hang either: a GPU-bound loop spends most of its time in
cudaStreamSynchronize. So the rule asks what *changed*, with the CPU a thread spent as the proof
that it did something (docs/troubleshooting.md#my-job-hangs says it for users, with its blind
spots). Between two looks, the job moved on this node when, in one of its processes:

- values: a thread that ran on a CPU for at least RUN_SHARE of the time between the looks (RUN_MIN
  at least) has, in a frame it had at both looks (the same function at the same depth from the
  thread's start), a plain variable (int, float, str, bool, None, or a container of them) with
  another value: a step counter, a loss, an index. Running or waiting at the moment of the look
  does not matter. A frame py-spy shows without variables (a script's top level) counts with its
  line. Objects (py-spy shows them by address) do not count: a loop that polls makes a new object
  each try. Nor does a thread that barely ran: a timed wait that retries (the DataLoader's
  `queue.get(timeout=5)`, asyncio's loop, a retry counter in a loop that sleeps) wakes for
  microseconds and changes its deadline, not its work.
- stack: a thread that ran so, caught running at two samples in a row (a look is a burst of up to
  BURST samples, taken only until something moved) with other functions in its stack.
- files: a regular file a process holds open (not a log, nothing in the cluster folder: torch's
  flight recorder dumps land there) changed its offset, one it holds open for writing changed its
  size or modification time, or one was opened for writing. (A checkpoint writer puts a tensor down
  in one write call, or with pwrite, or through a memory map: the offset does not move while the
  file grows.)
- io: a thread of a process sleeps uninterruptibly (state D: it waits for storage) and the node
  wrote back MIN_WRITEBACK a second or more of its page cache since the last look (a checkpoint
  that rewrites a file waits, in its open, for the old pages to reach a slow disk: no frame, file
  or counter of its own moves meanwhile). A process stuck on storage that died writes nothing back.
- processes: a process of the job started or ended.
- native (read only once the job did not move for QUIET_LOOKS looks: a native dump costs seconds):
  none of the above on this node, and a thread that ran while its Python frames did not move is
  inside a compute kernel (BLAS, LAPACK, oneDNN, FFT, an ATen kernel: one long line of matmuls;
  also while it waits at a barrier for its helper threads) at two native dumps in a row, with no
  collective (NCCL, gloo) or CUDA library among its frames (a launch into a full queue waits as
  much as it works: the GPU's memory says which). A Python loop that polls through a short native
  call (`while flag.item() == 0`) is caught outside a kernel as often as not.
- gpu (as native): none of the above, and a process of the job moved GPU memory since the last
  look (NVML's memory utilisation, GPU_MEMORY % or more: per process where NVML samples them, else
  of a GPU one of them holds): a step of a model, a chain of matmuls queued from one line.
  A spinning collective or a flag poll keeps SMs busy while touching almost no memory.
- not Python: a process py-spy cannot read used OPAQUE_SHARE of a core.
Ray's job supervisor (it only waits for the entrypoint) is not looked at.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any

from raystack.allocation.node import gpus
from raystack.allocation.watchdog.reading import (
    PAGE,
    Opened,
    Sample,
    Thread,
    disk_wait,
    key_of,
    open_files,
    pages_written,
    spy,
    thread_cpu,
    to_sample,
    watched_processes,
)
from raystack.allocation.watchdog.stacks import py_spy
from raystack.store import paths
from raystack.store import progress as store
from raystack.waiting import REAL, Clock, Every, retry

log = logging.getLogger("raystack.node")
LOOK_EVERY = 2.0  # seconds between looks at the request file (one stat)
RUN_SHARE, RUN_MIN = 0.01, 0.02  # a thread's CPU between looks (share of the time, seconds) that counts
OPAQUE_SHARE = 0.05  # cores a process py-spy cannot read uses that count as moving (a compiler)
GPU_MEMORY = 5.0  # % NVML memory utilisation of a GPU the job holds that counts as moving
MIN_WRITEBACK = 256 << 10  # bytes a second the node writes back that count for a process in disk wait
QUIET_LOOKS = 2  # looks without a move before native frames and GPUs are read (a native dump: 0.5-10 s)
BURST, BURST_GAP = 3, 0.1  # samples in one look of a busy process, and seconds between them
# A native frame in a GPU library: GPU work is judged by the GPU's memory (a launch that waits for a
# full queue looks the same whether the queue moves or waits behind a collective that never ends)
GPU_LIBRARIES = re.compile(r"libcuda\.|libcudart|libnccl|libcublas|libcudnn|libnvrtc")
# Functions of collectives (a rank in one waits for its peers, whatever the frames above it)
COLLECTIVE = re.compile(r"nccl|gloo|c10d::|processgroup|mpi_|ucp_", re.IGNORECASE)
# Functions that compute: a thread with one of them in its stack computes, also while it waits for
# its helper threads at a barrier (OpenBLAS's exec_blas_async_wait, OpenMP's barrier)
COMPUTE = re.compile(
    r"gemm|gemv|blas|lapack|mkl_|dnnl|onednn|getrf|potrf|geqrf|syev|heev|hseqr|gesdd|fft|conv|"
    r"cpu_kernel|vectorized_loop|VectorizedLoop",  # (not c10's dispatcher: wrap_kernel_functor...)
    re.IGNORECASE,
)


@dataclass
class Look:
    """One process at one look."""

    cpu: dict[int, float]  # OS thread id -> CPU seconds so far
    files: dict[tuple[int, str], Opened]  # (fd, path) -> the file as it was
    samples: list[Sample] = field(default_factory=list)  # the last burst that was taken
    readable: bool = True  # py-spy read it (a Python process)
    disk_wait: bool = False  # one of its threads waited for storage (state D) at the look

    def used(self, before: Look) -> float:
        return sum(self.cpu.values()) - sum(before.cpu.values())

    def busy(self, before: Look, dt: float) -> set[int]:
        """Threads that ran for RUN_SHARE of `dt` (RUN_MIN at least) since `before`."""
        least = max(RUN_MIN, RUN_SHARE * dt)
        return {t for t, cpu in self.cpu.items() if cpu - before.cpu.get(t, 0.0) >= least}


@dataclass
class JobProgress:
    """What this node knows of one watched job."""

    every: float
    due: float = 0.0  # (clock) when to look next
    samples: int = 0  # looks taken
    at: float = 0.0  # (clock) of the last look
    moved: float = 0.0  # (wall) when it last moved; 0: never seen moving
    why: str = ""  # the evidence of that move
    procs: int = 0
    opaque: int = 0  # processes py-spy could not read at the last look
    written: int = 0  # the node's pages written back, at the last look
    error: str | None = None
    looks: dict[tuple[int, float], Look] = field(default_factory=dict)

    def row(self, host: str) -> dict[str, Any]:
        row: dict[str, Any] = {"host": host, "n": self.samples, "moved": self.moved, "procs": self.procs}
        for key, value in (("why", self.why), ("opaque", self.opaque), ("error", self.error)):
            if value:
                row[key] = value
        return row


# ---------------------------------------------------------------------------- the rule
def thread_moved(a: Thread, b: Thread) -> str | None:
    """What moved between two samples of one thread: 'values' (in a frame at the same depth from
    the thread's start, of the same function), 'stack' (other functions, running at both), or None."""
    for fa, fb in zip(a.frames, b.frames, strict=False):
        if fa[:2] != fb[:2]:
            return "stack" if a.active and b.active else None
        if fa[2] != fb[2]:
            return "values"
    return "stack" if len(a.frames) != len(b.frames) and a.active and b.active else None


def files_moved(before: Look, now: Look) -> bool:
    for key, file in now.files.items():
        old = before.files.get(key)
        if old is None:
            if file.writing:
                return True
        elif old.offset != file.offset or (file.writing and (old.size, old.mtime) != (file.size, file.mtime)):
            return True
    return False


def pair_moved(a: Sample, b: Sample, busy: set[int]) -> str | None:
    """'values' or 'stack' where one of the `busy` threads moved between two samples in a row."""
    for tid in sorted(busy & a.keys() & b.keys()):
        why = thread_moved(a[tid], b[tid])
        if why:
            return why
    return None


def computing(frames: list[dict[str, Any]]) -> bool:
    """A thread's native dump (innermost frame first) shows it computing on a CPU (the module
    docstring's rule): a compute kernel among its native frames, and no GPU library or collective."""
    native = list(takewhile(lambda f: f.get("module"), frames))  # (up to the first Python frame)
    names = [str(f.get("name")) for f in native]
    if any(GPU_LIBRARIES.search(str(f.get("module"))) for f in native):
        return False
    return not any(COLLECTIVE.search(n) for n in names) and any(COMPUTE.search(n) for n in names)


def native_compute(exe: str, pid: int, tids: set[int]) -> bool:
    """Whether one of the threads `tids` of a process computes in one long native call: a compute
    kernel in two native dumps in a row (a Python loop calling a short one, a poll of a tensor,
    is caught outside it, in the interpreter or the dispatcher, as often as not)."""

    def attempt(_n: int) -> bool | None:
        dump = spy(exe, pid, native=True) or []
        found = {int(t.get("os_thread_id") or 0) for t in dump if computing(t.get("frames") or [])}
        return None if found & tids else False

    return retry(attempt, 2, BURST_GAP) is None


def gpu_memory_moving(pids: set[int], since: float) -> bool:
    """One of `pids` read or wrote GPU memory since `since` (GPU_MEMORY % or more of the time): as
    NVML sampled each process where it can, else a GPU one of them holds, as a whole."""
    share = gpus.process_memory_activity(pids, since)
    if share is not None:
        return share >= GPU_MEMORY
    return any(util >= GPU_MEMORY and holders & pids for util, holders in gpus.memory_activity())


# ---------------------------------------------------------------------------- the probe
class ProgressProbe:
    """A duty of the node program's loop: looks at the watched jobs' processes on its own thread
    (py-spy takes tens of milliseconds a process) and keeps a row per job for the usage samples."""

    def __init__(self, cluster: str, host: str, clock: Clock = REAL, look_every: float = LOOK_EVERY):
        self.cluster, self.host, self.clock = cluster, host, clock
        self.gate = Every(look_every, clock)
        self.path = store.request_file(cluster)
        self.skip = str(paths.cluster(cluster).root)
        self.mtime = -1.0
        self.jobs: dict[str, JobProgress] = {}
        self.lock = threading.Lock()
        self.busy: threading.Thread | None = None

    def rows(self) -> dict[str, dict[str, Any]]:
        """{job id: {host, n, moved, procs, why, ...}} for the usage sample ({} when nothing is watched)."""
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
            except Exception as exc:  # (a vanished process, a full /proc: the next look)
                log.warning("progress of job %s not sampled: %s", job, exc)

    def sample(self, job: str) -> None:
        """One look at every process of `job` on this node; records whether the job moved, and how."""
        exe = py_spy()
        with self.lock:
            p = self.jobs.get(job)
        if p is None:
            return
        now_t = self.clock.now()
        p.due = now_t + p.every
        if exe is None:
            p.error, p.samples = "py-spy not found: progress unknown (CPU use counts)", p.samples + 1
            return
        procs = {key: proc for proc in watched_processes(job) if (key := key_of(proc)) is not None}
        looks = {
            key: Look(thread_cpu(key[0]), open_files(key[0], self.skip), disk_wait=disk_wait(key[0]))
            for key in procs
        }
        written = pages_written()
        rate = (written - p.written) * PAGE / max(now_t - p.at, 1e-3)
        wrote = bool(p.written) and rate >= MIN_WRITEBACK
        for key, look in looks.items():  # (what to compare with: the stacks last taken)
            old = p.looks.get(key)
            if old is not None:
                look.samples, look.readable = old.samples, old.readable
            else:
                dump = spy(exe, key[0], pause=not look.disk_wait)
                look.samples, look.readable = ([to_sample(dump)], True) if dump is not None else ([], False)
        why = self.judge(exe, p, looks, now_t - p.at, wrote) if p.samples else None
        if log.isEnabledFor(logging.DEBUG):  # (RAYSTACK_LOG_LEVEL=DEBUG: what each look saw)
            seen = self.seen(p, looks, procs)
            log.debug("progress %s look %d: %s; %s", job, p.samples, why or "not moved", seen)
        with self.lock:
            if why:
                p.moved, p.why = time.time(), why
            p.looks, p.procs, p.samples, p.at, p.written = looks, len(looks), p.samples + 1, now_t, written
            p.opaque = sum(1 for look in looks.values() if not look.readable)

    def seen(self, p: JobProgress, looks: dict[tuple[int, float], Look], procs: dict[Any, Any]) -> str:
        """One look's processes as the debug log shows them: pid, name, CPU since the last look,
        threads that ran, readable by py-spy, threads in the last sample."""
        parts = []
        for key, look in looks.items():
            before = p.looks.get(key)
            used = look.used(before) if before else 0.0
            busy = len(look.busy(before, max(self.clock.now() - p.at, 1e-3))) if before else 0
            name = "?"
            with contextlib.suppress(Exception):
                name = procs[key].name()
            parts.append(
                f"{key[0]} {name} cpu+{used:.2f}s busy={busy}"
                f" py={'y' if look.readable else 'n'} threads={len(look.samples[-1]) if look.samples else 0}"
            )
        return ", ".join(parts) or "no process"

    def judge(
        self, exe: str, p: JobProgress, looks: dict[tuple[int, float], Look], dt: float, wrote: bool = False
    ) -> str | None:
        """The evidence that the job moved since the last look (None: nothing did); `wrote`: the
        node wrote back MIN_WRITEBACK a second since. Processes are read busiest first and only
        until one moved; a process that did not run is not dumped."""
        if set(looks) != set(p.looks):
            return "processes"
        order = sorted(looks, key=lambda k: looks[k].used(p.looks[k]), reverse=True)
        frozen: dict[int, set[int]] = {}  # pid -> its threads that were busy while no frame moved
        for key in order:
            before, now = p.looks[key], looks[key]
            if files_moved(before, now):
                return "files"
            if now.disk_wait and wrote:
                return "io"
            busy = now.busy(before, dt)
            if not busy:
                continue
            why = self.stacks_moved(exe, key[0], before, now, busy)
            if why:
                return why
            if not now.readable:
                if now.used(before) >= OPAQUE_SHARE * dt:
                    return "cpu (not Python)"
                continue
            frozen[key[0]] = busy
        if time.time() - p.moved < QUIET_LOOKS * p.every:  # (moved lately: the costly looks can wait)
            return None
        return self.quiet_evidence(exe, frozen, {key[0] for key in looks}, time.time() - dt)

    def stacks_moved(self, exe: str, pid: int, before: Look, now: Look, busy: set[int]) -> str | None:
        """Samples of a busy process (BURST_GAP apart, up to BURST) until one of its busy threads
        moved between two samples in a row (the first against the last one taken before): 'values'
        or 'stack'; None when none did. The samples become the process's stacks to compare with."""
        taken: list[Sample] = []

        def take(_n: int) -> str | None:
            dump = spy(exe, pid, pause=not now.disk_wait)
            if dump is None:
                return ""  # (unreadable: no more tries)
            taken.append(to_sample(dump))
            pair = (before.samples[-1:] + taken)[-2:]
            return pair_moved(pair[0], pair[1], busy) if len(pair) == 2 else None

        why = retry(take, BURST, BURST_GAP, self.clock)
        now.samples, now.readable = (taken, True) if taken else (now.samples, False)
        return why or None

    def quiet_evidence(
        self, exe: str, frozen: dict[int, set[int]], pids: set[int], since: float
    ) -> str | None:
        """Where no Python frame moved: a busy thread computing in native code, or the job's GPUs
        moving memory."""
        for pid, tids in frozen.items():
            if tids and native_compute(exe, pid, tids):
                return "native"
        return "gpu" if gpus.real_gpus() and gpu_memory_moving(pids, since) else None
