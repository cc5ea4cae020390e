"""Process plumbing shared by the node program and the SPMD launcher."""

from __future__ import annotations

import contextlib
import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover (runs in the child, before exec)
    """`preexec_fn` for a child that must not outlive the process that started it (SIGKILL
    included, which no handler of the parent sees)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
