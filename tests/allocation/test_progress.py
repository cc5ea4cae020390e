"""Progress, not busyness (allocation/progress.py): the node's probe samples real processes with
py-spy and tells a loop that moves from one that spins in place or sleeps."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack.allocation.progress import JobProgress, ProgressProbe, Seen, moved, running_stacks
from raystack.allocation.stacks import py_spy
from raystack.store import progress as store
from tests.allocation.test_runner import home  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif(py_spy() is None, reason="py-spy comes with ray[default]")

# A loop whose stack changes every 0.1 s (the recursion goes one deeper), on a CPU all the time.
WALKS = """
import time
def walk(n):
    if n:
        return walk(n - 1)
    end = time.time() + 0.02
    while time.time() < end:
        pass
while True:
    walk(int(time.time() * 10) % 20)
"""
# On a CPU all the time inside one call, as a rank spinning in cudaStreamSynchronize: one stack.
SPINS = "any(iter(int, 1))\n"
SLEEPS = "import threading\nthreading.Event().wait()\n"  # asleep (an NCCL peer that never comes, on gloo)


@pytest.fixture
def processes() -> Iterator[dict]:
    started: dict[str, subprocess.Popen] = {}

    def start(job: str, code: str) -> subprocess.Popen:
        env = {"RAYSTACK_JOB_ID": job, "PATH": "/usr/bin:/bin"}
        proc = subprocess.Popen([sys.executable, "-c", code], env=env)
        started[f"{job}-{proc.pid}"] = proc
        return proc

    yield {"start": start, "all": started}
    for proc in started.values():
        proc.kill()
        proc.wait()


def rounds(probe: ProgressProbe, jobs: list[str], n: int) -> None:
    for _ in range(n):
        for job in jobs:
            probe.sample(job)
        time.sleep(0.45)


def test_a_moving_loop_moves_a_spin_in_place_or_a_sleep_does_not(home: Path, processes: dict) -> None:  # noqa: F811
    processes["start"]("walks", WALKS)
    processes["start"]("stuck", SPINS)
    processes["start"]("stuck", SLEEPS)
    time.sleep(1.0)  # (Python up and in its loop)
    store.watch("c", {"walks": 1.0, "stuck": 1.0})
    probe = ProgressProbe("c", "node1", look_every=0.0)
    probe._read_request()
    rounds(probe, ["walks", "stuck"], 4)
    rows = probe.rows()
    assert rows["walks"]["moved"] > 0 and rows["walks"]["n"] == 4 and rows["walks"]["procs"] == 1
    assert rows["stuck"] == {"host": "node1", "n": 4, "moved": 0.0, "procs": 2}
    # a process of the job that starts is a sign of progress too
    processes["start"]("stuck", SLEEPS)
    probe.sample("stuck")
    assert probe.rows()["stuck"]["moved"] > 0 and probe.rows()["stuck"]["procs"] == 3


def test_the_request_decides_what_is_sampled(home: Path) -> None:  # noqa: F811
    probe = ProgressProbe("c", "node1", look_every=0.0)
    probe()
    assert probe.rows() == {}
    store.watch("c", {"a": 5.0, "b": 2.0})
    probe()
    deadline = time.time() + 30
    while time.time() < deadline and (probe.busy is None or probe.busy.is_alive()):
        time.sleep(0.05)
    assert {job: row["n"] for job, row in probe.rows().items()} == {"a": 1, "b": 1}  # (no processes)
    store.watch("c", {"b": 2.0})
    time.sleep(0.01)
    probe()
    assert list(probe.rows()) == ["b"]


def sampled(code: str, n: int = 15) -> float:
    """When the probe first saw a process running `code` move, within `n` samples (0: never)."""
    probe = ProgressProbe("c", "node1", look_every=0.0)
    probe.jobs["j"] = JobProgress(1.0)
    for _ in range(n):
        probe.sample("j")
        if probe.rows()["j"]["moved"]:
            break
        time.sleep(0.2)
    return probe.rows()["j"]["moved"]


POLL = "def wait(flags):\n    while not any(flags):\n        pass\nwait([0])\n"  # (as work.is_completed())
HELPER = "def wait(work):\n    while not work.done():\n        pass\n"
HELPER += "class W:\n    def done(self):\n        return False\nwait(W())\n"
HOT = "def step(t):\n    return [(t * 31 + i) % 97 for i in range(400)][-1] + t + 1\n"
HOT += "t = 0\nwhile True:\n    t = step(t)\n"  # (most samples land on one line: its variables move)


@pytest.mark.parametrize(
    ("code", "moves"),
    [
        (POLL, False),  # polls in place over two lines: the same variables
        (HOT, True),  # one hot line, a loop variable that changes
        # The limits (docs/troubleshooting.md): a poll loop through a Python helper goes in and
        # out of it; a script's top level shows no variables, only its lines.
        (HELPER, True),
        ("while True:\n    pass\n", True),
    ],
)
def test_what_a_loop_changes_tells_work_from_polling(
    home: Path,  # noqa: F811
    processes: dict,
    code: str,
    moves: bool,
) -> None:
    processes["start"]("j", code)
    time.sleep(1.0)
    # (a busy 2-core machine delays samples: one that moves is given more of them to show it)
    assert (sampled(code, n=40 if moves else 15) > 0) is moves


def test_the_rules_of_one_process_between_two_samples() -> None:
    a, b = {1: (("f", "x.py", 1),)}, {1: (("f", "x.py", 2),)}
    assert moved(Seen(a, True, 1.0), Seen(b, True, 1.5))  # running, with another stack
    assert not moved(Seen(a, True, 1.0), Seen(a, True, 9.0))  # running in place (an NCCL spin)
    assert not moved(Seen({}, True, 1.0), Seen(b, True, 1.5))  # a poll loop caught awake once
    assert not moved(Seen({2: a[1]}, True, 1.0), Seen(b, True, 1.5))  # another thread each time
    assert not moved(None, Seen(b, True, 1.5))  # new: its start is counted by the caller
    assert moved(Seen({}, False, 1.0), Seen({}, False, 1.2))  # not readable: its CPU use counts
    assert not moved(Seen({}, False, 1.0), Seen({}, False, 1.01))
    dump = [
        {"thread_id": 7, "active": True, "frames": [{"name": "step", "filename": "t.py", "line": 3,
                                                     "locals": [{"name": "i", "repr": "4"}]}]},
        {"thread_id": 8, "active": False, "frames": [{"name": "wait", "filename": "th.py", "line": 9}]},
        {"thread_id": 9, "active": True, "frames": [{"name": "<module>", "filename": "s.py", "line": 5}]},
    ]  # fmt: skip
    assert running_stacks(dump) == {7: (("step", "t.py", (("i", "4"),)),), 9: (("<module>", "s.py", 5),)}
