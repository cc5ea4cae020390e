"""A job's end, heard when its driver exits rather than at the queue runner's next poll.

Ray's job supervisor (an actor on the head, where the queue runner runs too) starts the job's
entrypoint as a child process in a session of its own, polls it every 0.1 s and records the end
in the GCS. The runner asks Ray every TICK seconds. So for each running job on this node the
runner keeps a thread that waits on the driver's process (the supervisor's children, found by
the job's RAYSTACK_JOB_ID; not the shell Ray starts beside it to kill the driver's group once the
supervisor is gone) and sets the runner's `wake` event when it exits: the runner then
asks Ray at once, and again every FAST seconds until Ray has recorded the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading

from raystack.store.files import listen

log = logging.getLogger("raystack.runner")

SUPERVISOR = "ray::JobSupervisor"  # the supervisor actor's process title
FAST = 0.01  # seconds between the runner's passes from a driver's exit until Ray records the end


def drivers(job_id: str, root: int) -> list:
    """The processes Ray's supervisor started for job `job_id` (its entrypoint's shell), among
    the descendants of process `root` (the head's node program)."""
    import psutil

    found = []
    try:
        tree = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            title = " ".join(proc.cmdline()[:1])
            if title.startswith(SUPERVISOR) and proc.environ().get("RAYSTACK_JOB_ID") == job_id:
                found += [c for c in proc.children() if not watcher(c)]
    return found


def watcher(proc: object) -> bool:
    """The supervisor's second child: a shell that kills the driver's group once the supervisor
    is gone (`while kill -s 0 <supervisor>; ...`). It lives as long as the supervisor."""
    import psutil

    try:
        return "while kill -s 0 " in " ".join(proc.cmdline())  # type: ignore[attr-defined]
    except psutil.Error:
        return True


def exited(procs: list) -> None:
    """Return once every process in `procs` has exited: a pidfd (Linux 5.3) turns readable at the
    exit itself, reaped or not (Ray's supervisor reaps its driver only at its next poll); psutil's
    polling where there is none."""
    import psutil

    fds = []
    try:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(proc.pid))
    except (AttributeError, OSError):
        for fd in fds:
            os.close(fd)
        psutil.wait_procs(procs)
        return
    try:
        for fd in fds:
            select.select([fd], [], [])
    finally:
        for fd in fds:
            os.close(fd)


class EndWatch:
    """One waiting thread per running job (its submission id); `wake` is set when a driver exits."""

    def __init__(self, root: int | None = None, live: bool = True):
        self.root = os.getppid() if root is None else root
        self.live = live  # (False: not on the head, where Ray's supervisors run; nothing watched)
        self.wake = threading.Event()
        self.watched: set[str] = set()
        self.exited: set[str] = set()  # submission ids whose driver exited (Ray may not know yet)
        self.heard: set[str] = set()  # submission ids whose driver a thread waits on
        self.asked: dict[str, float] = {}  # submission id -> when the runner last asked Ray
        self.lock = threading.Lock()  # (an exit heard after its job was forgotten stays forgotten)

    def watch(self, job_id: str, sid: str) -> None:
        if sid in self.watched or not self.live:
            return
        self.watched.add(sid)
        found = drivers(job_id, self.root)
        if found:
            self.heard.add(sid)
            threading.Thread(target=self._wait, args=(sid, found), name=f"end-{sid}", daemon=True).start()

    def _wait(self, sid: str, procs: list) -> None:
        exited(procs)
        log.debug("the driver of %s exited", sid)
        with self.lock:  # (else the runner would pass every FAST seconds for ever)
            if sid in self.watched:
                self.exited.add(sid)
        self.wake.set()

    def forget(self, sid: str) -> None:
        with self.lock:
            self.watched.discard(sid)
            self.exited.discard(sid)
            self.heard.discard(sid)
            self.asked.pop(sid, None)

    def quiet(self, sid: str, now: float, steady: float) -> bool:
        """Whether the runner may leave running job `sid` unasked in this pass: its end will wake
        the runner (a thread waits on its driver, which has not exited) and Ray was asked less
        than `steady` seconds ago. False records that Ray is asked now."""
        with self.lock:
            heard = sid in self.heard and sid not in self.exited
            if heard and now - self.asked.get(sid, -1e18) < steady:
                return True
            self.asked[sid] = now
            return False

    def listen(self, path: str) -> bool:
        """Wake the runner when a byte comes down the named pipe `path` (made here, 0600, in the
        head's node-local temp folder): `raystack submit` on this machine writes one once its job
        is queued (store/queue.py: enqueue_all), so the job goes to Ray at once, not at the next pass.
        From another machine (a login node) the pipe is not there: the runner's TICK finds it."""
        return listen(path, self.wake.set, "runner-wake")

    def pause(self, seconds: float) -> None:
        """Wait `seconds`, or less: until a driver exits; FAST while an exit is not in Ray yet."""
        self.wake.wait(FAST if self.exited else seconds)
        self.wake.clear()
