"""Stack dumps on a node: every node program answers the requests in logs/stacks.request
(store/stacks.py) by running py-spy on each process of the job that descends from it, and by
asking each of the job's PyTorch ranks for its flight recorder (the named pipe torch opens where
TORCH_NCCL_DEBUG_INFO_PIPE_FILE is set: raystack sets it for every job, spec/submission.py).

The node program is the ancestor (and subreaper) of every Ray process on its node, so py-spy
may attach to them where the kernel allows tracing one's own descendants only (Yama
ptrace_scope 1, the default on most distributions). Every process of a job carries the job's
RAYSTACK_JOB_ID in its environment (Ray's drivers and workers, and what they start: SPMD ranks).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from raystack.store import stacks as store
from raystack.store.files import poke
from raystack.waiting import REAL, Clock, Every, at_most, retry

log = logging.getLogger("raystack.node")
DUMP_TIMEOUT = 20.0  # seconds one py-spy dump may take
TRIES, RETRY_AFTER = 3, 1.0  # py-spy dumps of one process, and seconds between them
FLIGHT_WAIT = 15.0  # seconds the ranks' flight recorders may take to write their dumps (~6 s seen)
MAX_PROCESSES = 64  # per node and request
POLL = 5.0  # seconds between looks at the request file (one stat per node: O(N) in all)
NOT_PYTHON = {"bash", "sh", "dash", "sleep", "tee", "cat", "srun", "nvidia-smi"}


def py_spy() -> str | None:
    """py-spy from this Python's environment (ray[default] installs it), else from PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def job_processes(job_id: str) -> list[psutil.Process]:
    """This node program's descendants that belong to raystack job `job_id`."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.name() in NOT_PYTHON:
                continue
            if proc.environ().get("RAYSTACK_JOB_ID") == job_id:
                found.append(proc)
    return found[:MAX_PROCESSES]


def header(proc: psutil.Process) -> str:
    """`# pid 820 rank 0/2 python: <command>` (the rank where the process has one: torchrun,
    DeepSpeed and accelerate give RANK and WORLD_SIZE); store/diagnosis.py reads it back."""
    env = proc.environ()
    rank = f" rank {env['RANK']}/{env.get('WORLD_SIZE', '?')}" if env.get("RANK", "").isdigit() else ""
    return f"# pid {proc.pid}{rank} {proc.name()}: {' '.join(proc.cmdline())[:500]}\n"


def uses_gpu(pid: int) -> bool:
    """Whether CUDA or NCCL is loaded in the process: its native frames then say where it waits."""
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return any("libcuda" in line or "libnccl" in line for line in fh)
    except OSError:
        return False


def dump(proc: psutil.Process, exe: str | None, tries: int = TRIES, clock: Clock = REAL) -> str:
    """One process's stacks (py-spy dump; with its native frames where it uses a GPU, to show a
    wait inside CUDA or NCCL), or why there are none. A dump that failed or came back without a
    thread is tried again (seen once in CI on a loaded 2-core machine: a sleeping rank's dump held
    no thread); the last try's reason is kept after the header, and the one-line cause says it."""
    try:
        head = header(proc)
    except psutil.Error as exc:
        return f"# pid {proc.pid}: gone ({type(exc).__name__})\n"
    if exe is None:
        return head + "py-spy not found (it comes with ray[default]): no stacks\n"
    base = [exe, "dump", "--full-filenames", "--pid", str(proc.pid)]
    why = "py-spy gave no thread"

    def attempt(_n: int) -> str | None:
        """The dump (or a final word); None to try again."""
        nonlocal why
        if not proc.is_running():
            return "gone before py-spy could read it\n"
        for argv in ([*base, "--native"], base) if uses_gpu(proc.pid) else (base,):
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=DUMP_TIMEOUT)
            except subprocess.TimeoutExpired:  # (not tried again: the job's end waits for it)
                return f"py-spy did not answer within {DUMP_TIMEOUT:.0f}s\n"
            except OSError as exc:
                return f"py-spy could not run: {exc}\n"
            if out.returncode == 0 and "\nThread " in f"\n{out.stdout}":
                return out.stdout
            # (--native can fail where the unwinder cannot: then without it)
            why = f"[py-spy: {(out.stderr or out.stdout).strip()[:300] or f'exit code {out.returncode}'}]"
            if "python version" in why:  # (not a Python process: no try will find a stack)
                return why + "\n"
        return None

    return head + (retry(attempt, tries, RETRY_AFTER, clock) or why + "\n")


def ask_flight_recorders(procs: list[psutil.Process]) -> list[Path]:
    """Write to each rank's flight-recorder pipe (torch dumps its recorder into the file named by
    TORCH_FR_DUMP_TEMP_FILE + rank); the files to wait for."""
    files = []
    for proc in procs:
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        stem, rank = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"), env.get("RANK", "")
        target = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        if not stem or not rank.isdigit() or not target:
            continue
        if poke(f"{stem}{rank}.pipe"):  # (not where the rank no longer reads it)
            files.append(Path(f"{target}{rank}"))
    return files


def wait_for_files(files: list[Path], since: float, timeout: float, clock: Clock = REAL) -> int:
    """Wait until every file was written after `since` (or `timeout`); how many were."""

    def written() -> int:
        n = 0
        for f in files:
            with contextlib.suppress(OSError):
                n += f.stat().st_mtime >= since - 1
        return n

    at_most(lambda: True if written() >= len(files) else None, 0.5, clock, timeout)
    return written()


def dump_job(cluster: str, host: str, job_id: str, asked: float) -> int:
    """Dump every process of `job_id` on this node into logs/jobs/<id>/stacks/; answer the request."""
    folder = store.folder(cluster, job_id)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    procs, exe = job_processes(job_id), py_spy()
    poked = time.time()
    recorders = ask_flight_recorders(procs)
    with ThreadPoolExecutor(max_workers=8) as pool:
        texts = list(pool.map(lambda p: (p.pid, dump(p, exe)), procs))
    for pid, text in texts:
        store.keep_earlier(folder / f"{host}-{pid}.txt")
        (folder / f"{host}-{pid}.txt").write_text(text)
    flights = wait_for_files(recorders, poked, FLIGHT_WAIT) if recorders else 0
    store.answer(cluster, job_id, host, asked, len(texts))
    log.info(
        "stacks of job %s: %d process(es) on %s dumped into %s; %d of %d flight recorder(s)",
        *(job_id, len(texts), host, folder, flights, len(recorders)),
    )
    return len(texts)


class StackRequests:
    """A duty of the node program's loop: one stat of the request file every POLL seconds; each
    new request is answered on a thread of its own (py-spy takes seconds), one at a time."""

    def __init__(self, cluster: str, host: str, clock: Clock = REAL, every: float = POLL):
        self.cluster, self.host = cluster, host
        self.path = store.request_file(cluster)
        self.gate = Every(every, clock)
        self.mtime = 0.0
        self.started = time.time()  # (requests older than this node program are not answered)
        self.done: dict[str, float] = {}
        self.busy: threading.Thread | None = None

    def _mtime(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return 0.0

    def __call__(self) -> None:
        if not self.gate() or (self.busy is not None and self.busy.is_alive()):
            return
        mtime = self._mtime()
        if mtime == self.mtime:
            return
        self.mtime = mtime
        todo = {
            j: t
            for j, t in store.requests(self.cluster).items()
            if t > max(self.done.get(j, 0.0), self.started)
        }
        if not todo:
            return
        self.done.update(todo)
        self.busy = threading.Thread(target=self._answer, args=(todo,), name="stacks", daemon=True)
        self.busy.start()

    def _answer(self, todo: dict[str, float]) -> None:
        for job_id, asked in todo.items():
            try:
                dump_job(self.cluster, self.host, job_id, asked)
            except Exception as exc:  # (a full filesystem, a vanished process: the next request)
                log.warning("stacks of job %s not dumped: %s", job_id, exc)
