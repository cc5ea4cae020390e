"""File primitives for the shared filesystem: atomic writes, the folder lock, exclusive creation,
appending journals, and moving unreadable files aside (so one bad file never stops the rest).

Readers never move anything: a file that cannot be read is reported and left where it is. Only a
writer holding the folder lock may set a file aside, after reading it twice (`quarantine`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import select
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from raystack.errors import ClusterError
from raystack.store.paths import ClusterPaths
from raystack.waiting import REAL, Backoff, Clock, until

log = logging.getLogger("raystack")
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}  # flock is not supported here
LINK_LEASE = 120.0  # seconds after which a link lock whose holder did not release it is broken
LINK_MODE = "link"  # what a cluster folder's .locks file says when flock cannot be trusted there


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError of writing `path` names it: write() on a full disk or over quota raises ENOSPC
    or EDQUOT without a file name, and the user must hear which filesystem is full."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def read_dict(path: Path) -> dict[str, Any]:
    """A small JSON object written in place or aside (a heartbeat, a lease: trailing NULs and
    blanks of an in-place rewrite ignored), or {} when there is none to read."""
    try:
        data = json.loads(path.read_bytes().rstrip(b" \0\n") or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with naming(path), os.fdopen(fd, "w") as fh:
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
    """Create `path` holding `text` only if it does not exist yet; False if it did.

    The file appears complete or not at all: it is written under a temporary name and then
    hard-linked into place (link fails if the name exists, atomically, on NFS too). An O_EXCL
    create followed by a write leaves an empty file visible in between, which a listing racing
    it would read as unreadable."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with naming(path), os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:  # NOTE: NFS may report a link that it made as failed: check
            if os.stat(tmp).st_nlink != 2:
                raise
            log.debug("link %s reported %s but was made", path, exc)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def touch(path: Path) -> None:
    """An empty marker file (0600)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def private(path: str, flags: int) -> int:
    """An opener for open(): a file it creates is 0600 whatever the umask (the cluster folder's
    lock, journal and logs are the user's only, as its 0700 folders are)."""
    return os.open(path, flags, 0o600)


def poke(pipe: str, byte: bytes = b"1") -> bool:
    """Write one byte to the named pipe `pipe` if someone reads it; False where it is missing,
    not a pipe (a regular file is never written), read by nobody (ENXIO) or full."""
    try:
        if not stat.S_ISFIFO(os.stat(pipe).st_mode):
            return False
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, byte)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def listen(pipe: str, heard: Callable[[], None], name: str) -> bool:
    """Call `heard` in a thread of its own each time bytes come down the named pipe `pipe` (made
    here, 0600, in place of what was there); False where it cannot be made (the caller polls)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pipe)  # (a listener's before this one's)
    try:
        os.mkfifo(pipe, 0o600)
        # (this side holds a writer too: the reader never sees an end-of-file between writes)
        fds = (os.open(pipe, os.O_RDONLY | os.O_NONBLOCK), os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        log.warning("no wake-up pipe at %s (%s)", pipe, exc)
        return False

    def read() -> None:
        while True:
            select.select([fds[0]], [], [])
            with contextlib.suppress(BlockingIOError):
                os.read(fds[0], 4096)
            heard()

    threading.Thread(target=read, name=name, daemon=True).start()
    return True


def append_line(path: Path, line: str) -> None:
    """Append one line (call under the folder lock: NFS has no atomic O_APPEND across hosts)."""
    with naming(path), open(path, "a", opener=private) as fh:
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
    """An exclusive lock on one cluster's folder: flock on .lock (the NFS client makes it a lock
    the server arbitrates), or a link lock where flock is missing (Lustre without `flock`: ENOSYS)
    or cannot be trusted across hosts (the folder's .locks file says `link`, written when `up`
    found the head's lock invisible from the login node: `localflock`, NFS `nolock`)."""
    if uses_link_locks(paths):
        with link_lock(paths.link_lock):
            yield
        return
    with open(paths.lock, "a", opener=private) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in NO_LOCKS:
                raise
            _NO_FLOCK.add(str(paths.root))
            log.info("flock is not supported in %s (%s): using link locks", paths.root, exc.strerror)
        else:
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
            return
    with link_lock(paths.link_lock):
        yield


_NO_FLOCK: set[str] = set()  # folders whose flock failed with ENOSYS & co in this process


def uses_link_locks(paths: ClusterPaths) -> bool:
    """Whether this folder's lock is a link lock (flock failed here, or .locks says so)."""
    if str(paths.root) in _NO_FLOCK:
        return True
    try:
        return paths.lock_mode.read_text().split("\n", 1)[0].strip() == LINK_MODE
    except OSError:
        return False


def use_link_locks(paths: ClusterPaths, why: str) -> None:
    """From now on every process uses link locks in this folder (they read .locks at each lock)."""
    atomic_write(paths.lock_mode, f"{LINK_MODE}\n# {why}\n", mode=0o600)


def hold_probe(paths: ClusterPaths, allocation: str) -> IO[str] | None:
    """The head's node program holds a lock on .lockprobe for its lifetime (the kernel releases
    it when the program dies), the file saying which allocation holds it: `lock_seen` on another
    host tells whether locks are shared between hosts."""
    fh = open(paths.lock_probe, "a+")  # noqa: SIM115 (held open for the node program's lifetime)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"allocation": allocation, "host": socket.gethostname(), "pid": os.getpid()}))
    fh.flush()
    return fh


def lock_seen(paths: ClusterPaths, allocation: str | None) -> bool | None:
    """From another host than the head's, while the head of `allocation` runs: True when its lock
    on .lockprobe is seen (locks are shared between hosts), False when this host could take it
    too (node-local locks: `localflock`, NFS `nolock`), None when it cannot tell (no such head's
    lock was written, or flock is unsupported here: link locks then anyway)."""
    try:
        with open(paths.lock_probe, "a+") as fh:
            fh.seek(0)
            try:
                holder = json.loads(fh.read() or "{}")
            except ValueError:
                holder = {}
            if not allocation or not isinstance(holder, dict) or holder.get("allocation") != allocation:
                return None
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno in NO_LOCKS:
                    return None
                raise
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except OSError:
        return None


@contextlib.contextmanager
def link_lock(
    path: Path, lease: float = LINK_LEASE, timeout: float = 600.0, clock: Clock = REAL
) -> Iterator[None]:
    """A lock that needs only link(2) to be atomic (true on every POSIX and NFS filesystem): a
    unique file linked to `path`; whoever makes the link holds the lock. A holder that died is
    broken after `lease` seconds (a transaction takes milliseconds)."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "thread": threading.get_ident()}
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    tmp.write_text(json.dumps({**me, "t": time.time()}))

    def linked() -> bool | None:
        if _link(tmp, path):
            return True
        _break_if_stale(path, lease)
        return None

    def late() -> ClusterError:
        return ClusterError(f"could not take the lock {path} within {timeout:.0f}s (held by {_who(path)})")

    try:
        until(linked, Backoff(first=0.005, cap=0.2, jitter=0.0).next, clock, timeout, late)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.stat(tmp).st_ino:
                    os.unlink(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _link(tmp: Path, path: Path) -> bool:
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # NOTE: NFS may answer a retransmitted link with an error after making it
        return os.stat(tmp).st_nlink == 2


def _break_if_stale(path: Path, lease: float) -> None:
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return
    if age > lease:
        stale = path.with_name(f".{path.name}.stale.{secrets.token_hex(4)}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, stale)  # (one breaker wins: the others find it gone)
            log.warning("broke the lock %s, held for %.0fs by %s", path, age, _who(stale))
            os.unlink(stale)


def _who(path: Path) -> str:
    try:
        return path.read_text()[:200]
    except OSError:
        return "nobody now"


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


def quarantined(paths: ClusterPaths, folder: Path) -> dict[str, Path]:
    """What `quarantine` moved out of `folder`: each file's name there -> where it lies now (the
    newest, when one was moved more than once)."""
    prefix = f"{folder.name}-"
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(paths.corrupt), key=lambda e: e.name):
            if entry.name.startswith(prefix):
                found[entry.name.removeprefix(prefix).rpartition(".")[0]] = Path(entry.path)
    return found
