"""File primitives for the shared filesystem: atomic writes, the folder lock, exclusive creation,
appending journals, and moving unreadable files aside (so one bad file never stops the rest).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from raystack.store.paths import ClusterPaths

log = logging.getLogger("raystack")


def atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def create_exclusive(path: Path, text: str, mode: int = 0o600) -> bool:
    """Create `path` holding `text` only if it does not exist yet (O_EXCL); False if it did."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def touch(path: Path) -> None:
    """An empty marker file (0600)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def append_line(path: Path, line: str) -> None:
    """Append one line (call under the folder lock: NFS has no atomic O_APPEND across hosts)."""
    with open(path, "a") as fh:
        fh.write(line.rstrip("\n") + "\n")
        fh.flush()


def make_private_dirs(paths: ClusterPaths) -> None:
    """The cluster's folders, 0700 whatever the umask (a hand-submitted allocation has any umask)."""
    paths.root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in paths.folders():
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if folder.stat().st_mode & 0o077:
            os.chmod(folder, 0o700)


@contextlib.contextmanager
def locked(paths: ClusterPaths) -> Iterator[None]:
    """An exclusive lock on one cluster's folder (flock on .lock; fcntl locks on NFS)."""
    with open(paths.lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def quarantine(paths: ClusterPaths, path: Path, why: str) -> Path | None:
    """Move an unreadable file into `corrupt/` with one warning naming it; the rest keeps working."""
    paths.corrupt.mkdir(exist_ok=True, mode=0o700)
    target = paths.corrupt / f"{path.parent.name}-{path.name}.{time.time_ns()}"
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None  # someone else moved it first
    except OSError as exc:
        log.warning("cannot move unreadable %s aside (%s): %s", path, why, exc)
        return None
    log.warning("moved unreadable %s to %s: %s", path, target, why)
    return target
