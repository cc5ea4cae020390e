"""A node's stack dumps of a job: a second request (the watchdog's, after a user's `raystack
stacks`) keeps the first dump in stacks/earlier/ instead of overwriting it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from raystack.allocation.watchdog.stacks import dump, dump_job, py_spy
from raystack.store import cluster as clusters
from raystack.store import stacks as store


def test_a_later_dump_keeps_the_earlier_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RAYSTACK_JOB_ID": "j-1"}
    )
    try:
        assert dump_job("c", "node1", "j-1", time.time()) == 1
        mine = store.folder("c", "j-1") / f"node1-{child.pid}.txt"
        mine.write_text(mine.read_text() + "\n# the user's own request\n")
        assert dump_job("c", "node1", "j-1", time.time()) == 1
    finally:
        child.kill()
    kept = list((store.folder("c", "j-1") / "earlier").glob(f"node1-{child.pid}-*.txt"))
    assert len(kept) == 1 and "the user's own request" in kept[0].read_text()
    assert mine.exists() and "the user's own request" not in mine.read_text()
    assert [p.name for p in store.kept("c", "j-1").files] == [mine.name]  # (the latest is what is shown)


def test_a_failed_py_spy_dump_is_tried_again_and_a_last_failure_says_why(tmp_path: Path) -> None:
    """py-spy reads another process's memory while it runs: a try that fails (here, a wrapper that
    fails the first call, as py-spy once did in CI) is followed by another; one that always fails
    leaves its reason after the header, for the one-line cause."""
    exe = py_spy()
    assert exe is not None
    calls = tmp_path / "calls"
    flaky = tmp_path / "flaky-py-spy"
    flaky.write_text(
        f'#!/bin/sh\necho x >> {calls}\n[ "$(wc -l < {calls})" -gt 1 ] && exec {exe} "$@"\n'
        'echo "Error: Failed to copy PyCodeObject" >&2; exit 1\n'
    )
    flaky.chmod(0o755)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        text = dump(psutil.Process(child.pid), str(flaky))
        assert text.startswith(f"# pid {child.pid} ") and f"\nThread {child.pid} (idle)" in text, text
        assert calls.read_text().count("x") >= 2  # (the first failed; a real py-spy may fail once too)
        broken = tmp_path / "broken-py-spy"
        broken.write_text('#!/bin/sh\necho "Error: Failed to copy PyCodeObject" >&2; exit 1\n')
        broken.chmod(0o755)
        text = dump(psutil.Process(child.pid), str(broken), tries=2)
        assert text.splitlines()[1] == "[py-spy: Error: Failed to copy PyCodeObject]", text
    finally:
        child.kill()


def test_each_rank_still_reading_its_flight_recorder_pipe_is_asked(tmp_path: Path) -> None:
    """A rank's pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE + rank + .pipe) gets a byte and its dump
    file is waited for; a rank whose pipe nobody reads any more is not waited for."""
    from raystack.allocation.watchdog.stacks import ask_flight_recorders

    reader = (
        "import os, sys, time; p = sys.argv[1]; os.mkfifo(p); fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK); "
        "open(p + '.ready', 'w').close(); time.sleep(60)"
    )
    procs = []
    for rank, reads in ((0, True), (1, False)):
        env = {
            **os.environ,
            "RANK": str(rank),
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "fr_"),
            "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "dump_"),
        }
        pipe = str(tmp_path / f"fr_{rank}.pipe")
        code = reader if reads else "import time; time.sleep(60)"
        if not reads:
            os.mkfifo(pipe)  # (the rank left it: nobody reads it)
        procs.append(subprocess.Popen([sys.executable, "-c", code, pipe], env=env))
    try:
        deadline = time.time() + 20
        while not (tmp_path / "fr_0.pipe.ready").exists() and time.time() < deadline:
            time.sleep(0.05)
        asked = ask_flight_recorders([psutil.Process(p.pid) for p in procs])
        assert asked == [tmp_path / "dump_0"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
