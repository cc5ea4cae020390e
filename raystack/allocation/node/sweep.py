"""`python -m raystack.allocation.node.sweep JOBID`: SIGKILL what allocation JOBID left on this node.

The allocation script runs it on the first node (the head's) once every node program has ended.
A head node program that was SIGKILLed (the OOM killer) could not stop what its Ray had started:
Ray's own clean-up misses some (a job's driver, whose supervisor and watcher were killed in the
same instant, lives on as an orphan). SLURM's cgroup would take them on most sites; with
proctrack/linuxproc (the testbed) nothing would. Every Ray process of an allocation carries
RAYSTACK_ALLOCATION in its environment (allocation/raystart.ray_env), and so does what it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path


def leftovers(alloc_id: str) -> list[int]:
    """This user's processes on this node that belong to allocation `alloc_id` (not this one)."""
    needle = f"RAYSTACK_ALLOCATION={alloc_id}\0".encode()
    mine = {os.getpid(), os.getppid()}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in mine:
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
    return found


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m raystack.allocation.node.sweep JOBID", file=sys.stderr)
        return 2
    pids = leftovers(sys.argv[1])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        print(
            f"raystack: {len(pids)} process(es) of allocation {sys.argv[1]} left on this node: killed",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
