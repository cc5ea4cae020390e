"""Process plumbing shared by the node program and the SPMD launcher."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover (runs in the child, before exec)
    """`preexec_fn` for a child that must not outlive the process that started it (SIGKILL
    included, which no handler of the parent sees)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def after_exit(commands: str, while_exists: str | None = None) -> None:
    """Run shell `commands` once this process has exited (SIGKILL included): a watcher started in
    the background of a shell that exits at once, so it is not this process's child (Ray kills a
    worker's children when it exits, and a child watcher died before it could clean).

    `while_exists`: a path whose removal ends the watcher without running them (the process
    lives on, the thing it guards is done: a launch host's launch, closed; a watcher per launch
    left looping for the host's life forked a `sleep` every second per job run there)."""
    alive = f"kill -0 {os.getpid()} 2>/dev/null"
    if while_exists:
        alive = f"[ -e {shlex.quote(while_exists)} ] || exit 0; {alive}"
    subprocess.run(
        f"( while {alive}; do sleep 1; done; {commands} ) </dev/null >/dev/null 2>&1 &",
        shell=True,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
