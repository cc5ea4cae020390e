"""Node temp folders left by allocations that ended without removing them, removed at the next
start on the node.

A node program removes its private temp folder (Ray's session: logs, sockets, and the pip
environments Ray made there) when it stops (raystart.stop_ray). Started from a virtualenv, Ray
makes each pip environment by copying that virtualenv (3.8 GB and 78,000 files on the testbed),
and deleting one takes longer than SLURM leaves a step after its SIGTERM (KillWait: 15 s on the
testbed; 9-12 s for one copy on an idle disk, more with 4 nodes deleting at once); a node program
killed outright (SIGKILL, the OOM killer, a node lost) removes nothing. Both were left in /tmp.

So a node program holds a lock on a file in its folder for as long as it lives (`hold`), and at
its start looks at the folders beside its own (`sweep`): one whose lock it can take belongs to a
node program that is gone. It is renamed once (`rs-gone-...`: a rename is atomic, so of the node
programs of one machine starting at once only one takes the live name, and a removal cut short is
finished by the next start) and removed by a niced `rm -rf` in the background, off the start's
path. Only this user's folders that hold the lock
file (or were renamed so) are touched: a folder of another user, of an older raystack, or of a
node program that is still running stays.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger("raystack.node")

ALIVE = ".alive"  # the lock file in a node's folder, held by its node program
GONE = "rs-gone-"  # the name a folder of a gone node program is given before its removal
PREFIX = "rs-"  # node folders are rs-<allocation>-<host>-<random> (and rs-local-...)


def hold(root: Path) -> int | None:
    """Lock `root`'s lock file for as long as this process lives; the descriptor (never closed,
    not inherited by children). Made under another name and renamed, so that the file is never
    seen unlocked. None where the filesystem has no locks (a Lustre scratch mounted without
    `flock`): then there is no lock file, and no later start takes the folder."""
    made = root / f"{ALIVE}-{os.getpid()}"
    fd = os.open(made, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        os.close(fd)
        made.unlink(missing_ok=True)
        log.warning("no lock on %s (%s): a later start will not remove it if this one cannot", root, exc)
        return None
    os.replace(made, root / ALIVE)
    return fd


def retire(root: Path) -> Path:
    """`root` renamed as a gone node program's folder (at the node's stop, before its removal: a
    removal cut short by SLURM's KillWait is finished by the next start, whatever it had removed
    already, the lock file too; and by `sweep`); `root` itself where it cannot be renamed."""
    target = root.parent / f"{GONE}{root.name}"
    try:
        os.rename(root, target)
    except OSError:
        return root
    return target


def gone(folder: Path) -> bool:
    """Whether the node program that made `folder` is gone: its lock file is there, unlocked."""
    try:
        fd = os.open(folder / ALIVE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # (none: an older raystack's folder, or one being made)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def sweep(parent: Path, mine: Path | None = None) -> list[Path]:
    """Remove, in the background, the folders under `parent` of node programs that are gone
    (never `mine`); the folders it takes, renamed."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    taken = []
    for entry in entries:
        path = Path(entry.path)
        if not entry.name.startswith(PREFIX) or path == mine:
            continue
        try:
            ours = entry.stat(follow_symlinks=False).st_uid == os.getuid()
            if not (entry.is_dir(follow_symlinks=False) and ours):
                continue
        except OSError:
            continue
        if entry.name.startswith(GONE):
            taken.append(path)  # (a removal cut short)
        elif gone(path):
            target = retire(path)
            if target == path:
                continue  # (another node program of this machine took it first)
            taken.append(target)
    if taken:
        log.info("removing %d temp folder(s) of gone node programs in %s", len(taken), parent)
        subprocess.Popen(
            ["nice", "-n", "19", "rm", "-rf", "--", *map(str, taken)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    return taken
