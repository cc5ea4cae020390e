"""A node's stack dumps of a job: a second request (the watchdog's, after a user's `raystack
stacks`) keeps the first dump in stacks/earlier/ instead of overwriting it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raystack.allocation.stacks import dump_job
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
