"""A third scheduler, plugged in from outside raystack: tests/backends/toy.py, registered through
the `raystack.backends` entry-point group as another package's backend would be (its dist-info
written here, on PYTHONPATH), runs a cluster's life on the testbed's nodes without SLURM: `up`
from a profile naming it, READY on 2 nodes, a queued job and plain `ray job submit` SUCCEED,
`status --json` names it, `down` leaves no process. Its files are the list docs/development.md
gives ("A new scheduler"): the allocator module and the entry point, nothing in raystack/."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from raystack.store import cluster as clusters
from tests.backends import toy

from ..conftest import wait_until
from .test_cluster import ray_job_submit, raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "docs" / "development.md"


@pytest.fixture
def plugged(rs_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The toy backend installed as a plug-in (an entry point in a dist-info on PYTHONPATH, which
    every process of the cluster inherits) and a profile that names it."""
    site = tmp_path / "site"
    info = site / "raystack_toy-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: raystack-toy\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[raystack.backends]\ntoy = tests.backends.toy\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO)]))
    profile = rs_home / "toy.yaml"
    testbed = (REPO / "slurm" / "profiles" / "testbed.yaml").read_text()
    profile.write_text(re.sub(r"(?m)^partition:.*$", "backend: toy", testbed))
    return profile


def test_a_plugged_in_scheduler_runs_a_cluster_s_life_without_slurm(plugged: Path, rs_home: Path) -> None:
    dry = raystack("up", "-N", "2", "-P", str(plugged), "--name", "toy", "--dry-run")
    assert dry.returncode == 0 and "argv:" not in dry.stdout, dry.stdout + dry.stderr  # (no sbatch)
    assert "this script runs once on every node" in dry.stdout, dry.stdout  # (its own template)
    up = raystack("up", "-N", "2", "-P", str(plugged), "--name", "toy", "--json", timeout=300)
    assert up.returncode == 0, up.stderr
    record = clusters.read("toy")
    assert record.backend == "toy" and record.state.value == "READY"
    assert sorted(record.nodes) == ["node1", "node2"] and record.allocation_id.startswith("toy")
    status = json.loads(raystack("status", "toy", "--json").stdout)
    assert status["backend"] == "toy" and status["allocation_state"] == "RUNNING", status
    assert status["nodes_alive"] == 2 and status["gpus"] == 8, status
    queued = raystack("submit", "-c", "toy", "--json", "--", "python", "-c", "print('queued on toy')")
    assert queued.returncode == 0, queued.stderr
    job = json.loads(queued.stdout)["id"]
    shown = wait_until(
        lambda: (
            (j := json.loads(raystack("job", job, "-c", "toy", "--json").stdout))["state"]
            in ("SUCCEEDED", "FAILED")
            and j
        ),
        120,
        "the queued job's end",
    )
    assert shown["state"] == "SUCCEEDED", shown
    assert "queued on toy" in raystack("logs", job, "-c", "toy").stdout
    plain = ray_job_submit("toy", rs_home, "python", "-c", "print('plain on toy')")
    assert plain.returncode == 0 and "plain on toy" in plain.stdout, plain.stdout + plain.stderr
    down = raystack("down", "toy")
    assert down.returncode == 0, down.stderr
    alloc = record.allocation_id or ""
    wait_until(lambda: not toy.processes(alloc), 60, "every process of the toy allocation")
    assert clusters.read("toy").state.value == "STOPPED", clusters.read("toy")


def test_the_new_scheduler_is_the_files_the_development_guide_lists() -> None:
    """The guide names the allocator module and how it is registered; the toy backend is only that
    (one module under tests/, an entry point), and no module of raystack/ names it."""
    text = DEV.read_text()
    assert "raystack.backends" in text and "tests/backends/toy.py" in text
    named = [p for p in (REPO / "raystack").rglob("*.py") if re.search(r"\btoy\b", p.read_text())]
    assert named == []
