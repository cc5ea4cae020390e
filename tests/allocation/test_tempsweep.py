"""Node temp folders of node programs that are gone: found by their free lock, removed at the next
start; a live one's, another's, an older raystack's stay (real processes, real locks)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raystack.allocation.node import tempsweep
from raystack.allocation.node.context import NodeContext, private_temp_dir
from tests.conftest import wait_until

HOLDER = (
    "import sys, time; from pathlib import Path; from raystack.allocation.node import tempsweep; "
    "tempsweep.hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
)


def holder(folder: Path) -> subprocess.Popen:
    """A process that holds `folder`'s lock as a node program does, until it is killed."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_folder_is_gone_only_once_its_node_program_is(tmp_path: Path) -> None:
    folder = tmp_path / "rs-7-node1-abc"
    proc = holder(folder)
    try:
        assert (folder / tempsweep.ALIVE).exists() and not tempsweep.gone(folder)
        assert not tempsweep.gone(folder)  # (asking does not take the lock from it)
    finally:
        proc.send_signal(signal.SIGKILL)  # (killed outright: nothing of it runs at its end)
        proc.wait()
    assert tempsweep.gone(folder)
    assert not tempsweep.gone(tmp_path / "rs-8-node1-old")  # (no lock file: an older raystack's)


def test_the_next_start_removes_the_folders_of_gone_node_programs_and_only_those(tmp_path: Path) -> None:
    dead = tmp_path / "rs-7-node1-abc"
    proc = holder(dead)
    (dead / "r" / "runtime_resources" / "pip").mkdir(parents=True)
    (dead / "r" / "runtime_resources" / "pip" / "big").write_bytes(b"x" * 4096)
    proc.kill()
    proc.wait()
    live = tmp_path / "rs-7-node2-def"
    alive = holder(live)
    older = tmp_path / "rs-6-node1-old"  # (an older raystack's: no lock file)
    older.mkdir()
    cut_short = tmp_path / f"{tempsweep.GONE}rs-5-node1-xyz"  # (a removal killed half-way)
    (cut_short / "r").mkdir(parents=True)
    other = tmp_path / "unrelated"
    other.mkdir()
    ctx = NodeContext("c", "9", 0, 1, "node1", "10.0.0.1", 0, 1, tmp_path / "rs-9-node1", 1 << 27, 30.0)
    try:
        mine = private_temp_dir(ctx)
        assert mine.temp_root is not None and mine.alive is not None
        wait_until(lambda: not dead.exists() and not cut_short.exists(), 30, "the gone folders removed")
        time.sleep(0.5)  # (a background rm has finished; nothing else may go)
        assert not list(tmp_path.glob(f"{tempsweep.GONE}*"))
        assert live.exists() and older.exists() and other.exists() and mine.temp_root.exists()
        # (the new node program's own folder is held: the next start leaves it)
        assert not tempsweep.gone(mine.temp_root)
        assert tempsweep.sweep(tmp_path) == []
    finally:
        alive.kill()
        alive.wait()
    assert tempsweep.sweep(tmp_path) == [tmp_path / f"{tempsweep.GONE}{live.name}"]


def test_two_starts_at_once_take_a_gone_folder_once(tmp_path: Path) -> None:
    dead = tmp_path / "rs-7-node1-abc"
    proc = holder(dead)
    proc.kill()
    proc.wait()
    code = (
        "import sys; from pathlib import Path; from raystack.allocation.node import tempsweep; "
        "print(len(tempsweep.sweep(Path(sys.argv[1]))))"
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    took = [int(run.communicate()[0]) for run in runs]
    # (one renamed it; one that listed the folder after may take the renamed one too: rm -rf twice)
    assert 1 in took and max(took) == 1, took
    wait_until(lambda: not any(tmp_path.iterdir()), 30, "the folder removed")
    assert os.listdir(tmp_path) == []


def test_a_filesystem_without_locks_leaves_the_folder_unheld_and_never_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")  # (Lustre without -o flock)

    folder = tmp_path / "rs-7-node1-abc"
    folder.mkdir()
    monkeypatch.setattr(tempsweep.fcntl, "flock", no_locks)
    assert tempsweep.hold(folder) is None
    assert list(folder.iterdir()) == []  # (no lock file: the node starts all the same)
    monkeypatch.undo()
    assert not tempsweep.gone(folder) and tempsweep.sweep(tmp_path) == []


def test_a_removal_at_stop_cut_short_is_finished_by_the_next_start(tmp_path: Path) -> None:
    folder = tmp_path / "rs-7-node1-abc"
    proc = holder(folder)
    (folder / "r" / "big").mkdir(parents=True)
    retired = tempsweep.retire(folder)  # (the node's stop, before its rm: SIGKILLed half-way,
    (retired / tempsweep.ALIVE).unlink()  # its lock file among the first removed)
    proc.kill()
    proc.wait()
    assert not folder.exists() and retired.name == f"{tempsweep.GONE}{folder.name}"
    assert tempsweep.sweep(tmp_path) == [retired]
    wait_until(lambda: not retired.exists(), 30, "the retired folder removed")
