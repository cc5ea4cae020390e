"""The queue runner hears a driver's exit at once: real processes shaped as Ray's supervisor
starts them (the driver's shell and, beside it, the shell that outlives it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from raystack.allocation.runner.endwatch import FAST, EndWatch, drivers

# A stand-in for Ray's supervisor actor: its process title, the job's env var, two children.
SUPERVISOR = (
    "import subprocess, sys, time; "
    "d = subprocess.Popen(['sh', '-c', 'sleep ' + sys.argv[1]]); "
    "w = subprocess.Popen(['sh', '-c', 'while kill -s 0 1; do sleep 1; done']); "
    "time.sleep(60)"
)


def supervisor(job_id: str, driver_s: float) -> subprocess.Popen:
    env = {**os.environ, "RAYSTACK_JOB_ID": job_id}
    argv = ["bash", "-c", f'exec -a ray::JobSupervisor {sys.executable} -c "{SUPERVISOR}" {driver_s}']
    proc = subprocess.Popen(argv, env=env)
    deadline = time.time() + 10
    while time.time() < deadline and len(drivers(job_id, os.getpid())) < 1:
        time.sleep(0.05)
    return proc


def test_a_drivers_exit_wakes_the_runner_and_the_watcher_shell_is_not_waited_for() -> None:
    other = supervisor("job-b", 30)
    mine = supervisor("job-a", 1.0)
    try:
        found = drivers("job-a", os.getpid())
        assert len(found) == 1 and "sleep 1.0" in " ".join(
            found[0].cmdline()
        )  # (not job-b's, not the watcher)
        ends = EndWatch(root=os.getpid())
        ends.watch("job-a", "job-a-s1")
        ends.watch("job-b", "job-b-s1")
        t0 = time.monotonic()
        ends.pause(20)  # woken by job-a's driver, not after 20 s
        assert time.monotonic() - t0 < 5
        assert ends.exited == {"job-a-s1"}  # job-b's driver and both watcher shells still run
        t0 = time.monotonic()
        ends.pause(20)  # an exit Ray has not recorded yet: the runner asks again soon
        assert time.monotonic() - t0 < FAST + 0.5
        ends.forget("job-a-s1")
        t0 = time.monotonic()
        ends.pause(0.3)
        assert time.monotonic() - t0 >= 0.25
    finally:
        for proc in (other, mine):
            proc.kill()
            proc.wait()
    assert drivers("job-x", os.getpid()) == []


def test_an_exit_heard_after_its_job_was_forgotten_does_not_keep_the_runner_fast() -> None:
    """Ray may record the end (and the runner forget the job) before the waiting thread hears the
    exit: that exit must not leave the runner passing every FAST seconds for ever."""
    proc = supervisor("job-c", 0.5)
    try:
        ends = EndWatch(root=os.getpid())
        ends.watch("job-c", "job-c-s1")
        ends.forget("job-c-s1")
        assert ends.wake.wait(10)  # (the exit is still heard)
        ends.wake.clear()
        assert ends.exited == set()
        t0 = time.monotonic()
        ends.pause(0.3)
        assert time.monotonic() - t0 >= 0.25
    finally:
        proc.kill()
        proc.wait()


def test_a_byte_down_the_runners_pipe_wakes_it_and_one_elsewhere_is_harmless(tmp_path) -> None:
    """`raystack submit` on the head's machine writes a byte down the runner's named pipe
    (store/queue.py: enqueue_all, store/files.py: poke): the runner's pause ends at once instead
    of at its next pass."""
    from raystack.store.files import poke

    pipe = str(tmp_path / "runner.wake")
    ends = EndWatch(root=os.getpid())
    assert ends.listen(pipe)
    assert oct(os.stat(pipe).st_mode & 0o777) == "0o600"
    t0 = time.monotonic()
    assert poke(pipe, b"+")
    ends.pause(5.0)
    assert time.monotonic() - t0 < 2.0  # (woken, not the 5 s pause)
    t0 = time.monotonic()
    ends.pause(0.3)  # (the byte was read: the next pause is a whole one)
    assert time.monotonic() - t0 >= 0.25
    # another runner takes the place: a new pipe, the old one's reader keeps nothing
    again = EndWatch(root=os.getpid())
    assert again.listen(pipe)
    assert poke(pipe, b"+")
    t0 = time.monotonic()
    again.pause(5.0)
    assert time.monotonic() - t0 < 2.0
    # no pipe, a regular file (never written), a pipe nobody reads: nothing happens, no error
    plain = tmp_path / "file"
    plain.write_text("")
    assert not poke(str(plain))
    assert plain.read_text() == ""
    assert not poke(str(tmp_path / "missing"))
    lonely = str(tmp_path / "lonely")
    os.mkfifo(lonely)
    assert not poke(lonely)
