"""The cluster folder's cap: the oldest allocations' copies go first, the user's logs never."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from raystack.store import cluster as clusters
from raystack.store import growth, paths
from raystack.store.cluster import ClusterRecord
from raystack.store.ledger import append_line


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", allocations=[{"alloc_id": j} for j in ("11", "12", "13")]))
    return tmp_path


def fill(path: Path, mb: float, age: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * int(mb * 2**20))
    os.utime(path, (time.time() - age, time.time() - age))


def test_prune_removes_the_oldest_allocations_first_and_never_the_jobs_logs(home: Path) -> None:
    p = paths.cluster("c")
    fill(p.ray_logs / "node1" / "11" / "raylet.out", 3, age=3000)  # allocation 11: the oldest
    fill(p.usage / "11-node1.jsonl", 1, age=3000)
    fill(p.ray_logs / "node1" / "12" / "raylet.out", 3, age=2000)
    fill(p.usage / "12-node1.jsonl", 1, age=2000)
    fill(p.ray_logs / "node1" / "raylet.out", 3, age=10)  # the current allocation (13)
    fill(p.usage / "13-node1.jsonl", 1, age=10)
    fill(p.job_log("old-1"), 2, age=4000)  # a driver log: never pruned
    fill(p.job_files("old-1") / "node1" / "Learner-7.err", 2, age=4000)  # gathered worker logs
    append_line(p.finished, f"{time.time() - 4000:.3f} old-1 SUCCEEDED")
    before = growth.tree_size(p.root)
    assert growth.prune("c", "13", cap=before + 1) == []  # under the cap: nothing
    removed = growth.prune("c", "13", cap=int(before - 3.5 * 2**20))
    assert [r.split(" ")[0] for r in removed] == ["logs/ray/node1/11", "usage/11-node1.jsonl"]
    assert growth.tree_size(p.root) <= before - 3.5 * 2**20
    removed = growth.prune("c", "13", cap=int(6.1 * 2**20))
    assert "logs/jobs/old-1" in [r.split(" ")[0] for r in removed]  # gathered copies, oldest job first
    assert p.job_log("old-1").exists() and (p.ray_logs / "node1" / "raylet.out").exists()
    assert (p.usage / "13-node1.jsonl").exists()
