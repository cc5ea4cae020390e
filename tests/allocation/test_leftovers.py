"""A leftover of an ended job that holds GPU memory is ended by its node (allocation/node/duties.py):
vLLM's engine core outlived its SIGKILLed engine actor on the GPU machine and kept its memory.
Real processes here; which of them hold GPU memory is what nvidia-smi would say."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from raystack.allocation.node.duties import end_leftovers
from raystack.store import queue
from raystack.store.ledger import JobRequest, JobState, update_job
from tests.allocation.test_runner import home  # noqa: F401 (the fixture)

SLEEPS = "import time\ntime.sleep(600)\n"
PARENT = "import subprocess, sys, time\n"
PARENT += "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\ntime.sleep(600)\n"


def job(state: JobState) -> str:
    request = JobRequest(id=f"j{time.time_ns() % 10**8:08d}", name="j", cluster="c", entrypoint="x")
    job_id = queue.enqueue(request).id
    update_job("c", job_id, state=state)
    return job_id


def start(job_id: str, code: str = SLEEPS) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], env={"RAYSTACK_JOB_ID": job_id, "PATH": "/usr/bin:/bin"}
    )


def test_only_an_orphan_of_an_ended_job_is_ended_with_what_it_started(home: Path) -> None:  # noqa: F811
    ended, running = job(JobState.FAILED), job(JobState.RUNNING)
    leftover, alive, parent = start(ended, PARENT), start(running), psutil.Process()
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not psutil.Process(leftover.pid).children():
            time.sleep(0.1)
        [child] = psutil.Process(leftover.pid).children()  # (what the leftover started)
        cache: dict[str, bool] = {}
        assert end_leftovers("c", [child.pid, alive.pid], cache) == 0  # (not ours: its parent lives)
        assert end_leftovers("c", [leftover.pid, alive.pid], cache) == 1
        leftover.wait(timeout=10)
        psutil.wait_procs([child], timeout=10)
        assert not child.is_running() and alive.poll() is None
        assert cache == {ended: True, running: False}
        update_job("c", running, state=JobState.SUCCEEDED)  # (it ends later: seen then)
        assert end_leftovers("c", [alive.pid], cache) == 1
        alive.wait(timeout=10)
        assert parent.is_running()
    finally:
        for proc in (leftover, alive):
            proc.kill()
            proc.wait()
