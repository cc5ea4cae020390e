"""The runner's lease: at most one queue runner per cluster, across processes and nodes.

The lease is an exclusive lock on `runner.lease` in the cluster folder (flock; the NFS client
turns it into a byte-range lock that the server arbitrates), held for the runner's lifetime and
released by the kernel when it dies. The file also holds who holds it and a heartbeat, for
people and for filesystems without working locks, where a fresh heartbeat of another holder
keeps a second runner out.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from typing import IO

from raystack.store.files import read_dict
from raystack.store.paths import ClusterPaths

BEAT = 5.0  # seconds between heartbeats
STALE = 60.0  # a heartbeat older than this no longer counts where locks do not work
FAILING = 60.0  # passes failing without a break this long are written beside the heartbeat
WAITING = 30.0  # a wait for an ended job's leftovers this long is written too
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}


class Lease:
    def __init__(self, paths: ClusterPaths, allocation: str | None = None):
        self.path = paths.runner_lease
        self.allocation = allocation or os.environ.get("RAYSTACK_ALLOCATION")
        self.fh: IO[str] | None = None
        self.beaten = 0.0
        self.failing: tuple[float, str] | None = None  # (since, the last error) of failing passes
        self.waiting_since: float | None = None  # since when the queue waits for a job's leftovers

    def holder(self) -> dict:
        return read_dict(self.path)

    def acquire(self) -> str | None:
        """Take the lease; None on success, else a description of who holds it."""
        fh = open(self.path, "a+")  # noqa: SIM115 (held open for the runner's lifetime)
        os.chmod(self.path, 0o600)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return self._describe(self.holder())
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise
            other = self.holder()  # no working locks here: go by the heartbeat
            if other and other.get("pid") != os.getpid() and time.time() - other.get("heartbeat", 0) < STALE:
                fh.close()
                return self._describe(other)
        self.fh = fh
        self.beat(force=True)
        return None

    def beat(self, failed: str | None = None, held: dict | None = None, force: bool = False) -> None:
        """Refresh the heartbeat (cheap to call every pass: it writes every BEAT seconds).
        `failed`: why the pass just made failed (None: it did not). Passes that have failed
        without a break for FAILING seconds are written too, for `raystack status`: a queue that
        does not move says why (an unreadable ledger, a Ray answer misread, ...). So is `held`
        (what an ended job still holds while the queue waits for it: {job, held, until}) once
        the queue has waited WAITING seconds."""
        now = time.time()
        # (a wait or a failure that just ended is written at once: `status` said "the next job
        # waits for job X" for up to BEAT seconds after that job had started, and run)
        ended = (self.failing is not None and failed is None) or (
            self.waiting_since is not None and held is None
        )
        self.failing = None if failed is None else ((self.failing or (now, ""))[0], failed)
        self.waiting_since = None if held is None else (self.waiting_since or now)
        if self.fh is None or (not force and not ended and time.monotonic() - self.beaten < BEAT):
            return
        self.beaten = time.monotonic()
        info: dict[str, object] = {
            "allocation": self.allocation,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "heartbeat": now,
        }
        if self.failing and now - self.failing[0] >= FAILING:
            info["failing"] = {"since": self.failing[0], "error": self.failing[1][:300]}
        if held is not None and self.waiting_since and now - self.waiting_since >= WAITING:
            info["waiting"] = {**held, "held": str(held.get("held"))[:300], "since": self.waiting_since}
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(json.dumps(info))
        self.fh.flush()

    @staticmethod
    def _describe(info: dict) -> str:
        if not info:
            return "a runner whose details are not written yet"
        age = time.time() - float(info.get("heartbeat", 0))
        return (
            f"allocation {info.get('allocation')} on {info.get('host')}, pid {info.get('pid')}, "
            f"heartbeat {age:.0f}s ago"
        )
