"""What the progress probe reads of a process (watchdog/progress.py judges it): its threads' CPU
time and state, py-spy's stacks with their plain variables, the regular files it holds open, and
the node's writeback; and which processes of a job are read."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import psutil

from raystack.allocation.watchdog.stacks import job_processes

SPY_TIMEOUT = 10.0  # seconds one py-spy dump may take
PAGE = os.sysconf("SC_PAGE_SIZE")
MOST_FILES = 256  # open files looked at per process
SUPERVISOR = "ray::JobSupervisor"
LOGS = (".log", ".out", ".err")

Frame = tuple[str, str, object]  # (function, file, its plain values, or its line where it has none)


class Opened(NamedTuple):
    """A regular file a process holds open, as one look saw it."""

    offset: int
    writing: bool  # open for writing
    size: int = 0
    mtime: int = 0  # ns


@dataclass(frozen=True)
class Thread:
    active: bool  # on a CPU when sampled
    frames: tuple[Frame, ...]  # outermost first


Sample = dict[int, Thread]  # OS thread id -> its stack


def frame_key(frame: dict[str, Any]) -> Frame:
    """A frame as progress sees it: its function and file, with its plain variables' values where
    py-spy gives variables (objects left out: their reprs are addresses), else its line."""
    names = frame.get("locals")
    state: object
    if names:
        state = tuple(
            (str(v.get("name")), str(v.get("repr"))) for v in names if " at 0x" not in str(v.get("repr"))
        )
    else:
        state = int(frame.get("line") or 0)
    return (str(frame.get("name")), str(frame.get("filename")), state)


def to_sample(dump: list[dict[str, Any]]) -> Sample:
    """One `py-spy dump --json --locals` as {OS thread id: Thread}."""
    return {
        int(t.get("os_thread_id") or t.get("thread_id") or 0): Thread(
            bool(t.get("active")), tuple(frame_key(f) for f in reversed(t.get("frames") or []))
        )
        for t in dump
    }


def spy(exe: str, pid: int, native: bool = False, pause: bool = True) -> list[dict[str, Any]] | None:
    """py-spy's JSON dump of one process (with variables, or with native frames); None when it
    cannot be read (not Python, ptrace refused, gone). `pause=False` reads it running: a process
    with a thread in disk wait cannot be paused until its I/O ends (py-spy would wait for it)."""
    argv = [exe, "dump", "--json", "--native" if native else "--locals", "--pid", str(pid)]
    argv += [] if pause else ["--nonblocking"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=SPY_TIMEOUT)
        if out.returncode == 0:
            found = json.loads(out.stdout)
            return found if isinstance(found, list) else None
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass
    return None


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process (schedstat: nanoseconds; else stat: clock ticks)."""
    found = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                found[int(tid)] = int(fh.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                found[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                continue
    return found


def disk_wait(pid: int) -> bool:
    """Whether a thread of the process sleeps uninterruptibly (state D: waiting for storage)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "D":
                    return True
        except (OSError, IndexError):
            continue
    return False


def pages_written() -> int:
    """The node's page-cache pages written back to storage since it booted (0: not known)."""
    try:
        with open("/proc/vmstat") as fh:
            for line in fh:
                if line.startswith("nr_written "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def open_files(pid: int, skip: str) -> dict[tuple[int, str], Opened]:
    """The regular files a process holds open, with their offsets, sizes and times: not its
    standard streams or logs (output is the runner's to judge), nothing under `skip` (the cluster
    folder), /dev, /proc or /sys."""
    found: dict[tuple[int, str], Opened] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")[:MOST_FILES]
    except OSError:
        return found
    for fd in fds:
        if fd in ("0", "1", "2"):
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if (
                not target.startswith("/")
                or target.startswith(("/dev/", "/proc/", "/sys/", skip))
                or target.endswith(LOGS)
            ):
                continue
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            if not stat.S_ISREG(st.st_mode):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                info = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
            writing = int(info.get("flags", "0").strip(), 8) & 3 in (1, 2)
            pos = int(info.get("pos", "0").strip())
            found[(int(fd), target)] = Opened(pos, writing, st.st_size, st.st_mtime_ns)
        except (OSError, ValueError):
            continue
    return found


def watched_processes(job: str) -> Iterable[psutil.Process]:
    """The job's processes on this node that can show progress (Ray's job supervisor only waits)."""
    for proc in job_processes(job):
        try:
            if not proc.cmdline()[:1] or not proc.cmdline()[0].startswith(SUPERVISOR):
                yield proc
        except psutil.Error:
            continue


def key_of(proc: psutil.Process) -> tuple[int, float] | None:
    try:
        return (proc.pid, proc.create_time())
    except psutil.Error:
        return None
