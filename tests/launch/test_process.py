"""process.after_exit: shell commands run once a process has exited, SIGKILL included, and a
watcher that ends without running them once what it guards is gone (a launch host lives for the
cluster; each launch's watcher must not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_until

CHILD = """
import sys, time
from raystack.launch.process import after_exit
after_exit("touch " + sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
print("ready", flush=True)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 60)
"""


def watchers(marker: Path) -> list[str]:
    """The watcher shells waiting to touch `marker`."""
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if f"touch {marker}" in line and "kill -0" in line]


def start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_commands_run_after_the_process_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc = start(str(marker))
    assert watchers(marker) and not marker.exists()
    proc.kill()
    proc.wait()
    wait_until(marker.exists, 10, "the commands to run after the kill")
    wait_until(lambda: not watchers(marker), 5, "the watcher to end")


def test_a_watcher_ends_without_running_them_once_its_path_is_gone(tmp_path: Path) -> None:
    marker, guarded = tmp_path / "ran", tmp_path / "launch"
    guarded.mkdir()
    proc = start(str(marker), str(guarded))
    assert watchers(marker)
    guarded.rmdir()  # (the launch closed; the process that made it lives on)
    wait_until(lambda: not watchers(marker), 5, "the watcher to end")
    proc.kill()
    proc.wait()
    assert not marker.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    proc = start(str(marker), str(kept), "0")  # (the path stays: the commands run at the exit)
    proc.wait()
    wait_until(marker.exists, 10, "the commands to run after the exit")
