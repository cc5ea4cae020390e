"""Readers read: `status`, `queue`, `list`, `logs`, `wait`, `top` show an allocation that ended without
recording it (its head SIGKILLed, cancelled while pending) as ended, and write nothing; the
commands that change the cluster (`down`, `submit`, `up`) settle it, under the lock, once.

A real SLURM job stands for the allocation (no Ray is needed to end one unannounced)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raystack.adapters import slurm
from raystack.store import cluster as records
from raystack.store import paths, queue
from raystack.store.cluster import ClusterState
from raystack.store.ledger import JobState, read_job

from ..conftest import wait_until

pytestmark = pytest.mark.testbed


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raystack", *args], capture_output=True, text=True, timeout=120, env=os.environ
    )


def folder_state(root: Path) -> dict[str, tuple[int, str]]:
    """Every file and folder under root with its mtime and content digest."""
    state = {}
    for path in sorted(root.rglob("*")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        state[str(path.relative_to(root))] = (path.stat().st_mtime_ns, digest)
    return state


def running_job(rs_home: Path, name: str) -> tuple[str, str]:
    """A READY record whose allocation is a real SLURM job, and a job in flight in it."""
    script = rs_home / "sleeper.sh"
    script.write_text("#!/bin/bash\nsleep 600\n")
    alloc = slurm.sbatch(
        [f"--job-name=raystack-{name}", "--nodes=1", f"--output={rs_home}/s.out"], str(script)
    )
    wait_until(
        lambda: (i := slurm.job_info(alloc)) and i.state is slurm.AllocState.RUNNING, 60, "the sleeper"
    )
    records.create(name)
    records.write(
        records.ClusterRecord(
            name=name, state=ClusterState.READY, allocation_id=alloc, nodes_expected=1, gpus_per_node=4
        )
    )
    submitted = cli("submit", "-c", name, "--json", "--", "python", "-c", "print(1)")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    entry = queue.waiting(name)[0]
    assert queue.start(name, entry, alloc) is not None
    return alloc, job_id


def test_readers_show_an_unrecorded_end_and_write_nothing_down_settles_it(rs_home: Path) -> None:
    alloc, job_id = running_job(rs_home, "rd")
    slurm.scancel(alloc)  # (as if its head were SIGKILLed: nobody records the end)
    wait_until(lambda: (i := slurm.job_info(alloc)) and i.state.is_terminal(), 60, "the cancel")
    root = paths.cluster("rd").root
    before = folder_state(root)

    status = cli("status", "rd", "--json")
    assert status.returncode == 1  # (not ready)
    assert json.loads(status.stdout)["state"] == "STOPPED", status.stdout
    listed = {r["name"]: r for r in json.loads(cli("list", "--json").stdout)}
    assert listed["rd"]["state"] == "STOPPED"
    rows = json.loads(cli("queue", "rd", "--all", "--json").stdout)
    assert [(r["id"], r["state"]) for r in rows] == [(job_id, "INTERRUPTED")]  # (scancel: it resumes)
    assert json.loads(cli("job", job_id, "-c", "rd", "--json").stdout)["state"] == "INTERRUPTED"
    assert f"allocation {alloc} ended" in rows[0]["message"]
    waited = cli("wait", "rd", "--timeout", "30s")
    assert waited.returncode == 1 and "STOPPED" in waited.stderr, waited.stderr
    logs = cli("logs", job_id, "-c", "rd")
    assert logs.returncode == 0, logs.stderr
    top = cli("top", "rd", "--once", "--json")
    assert top.returncode == 1 and json.loads(top.stdout)["state"] == "STOPPED", top.stdout
    assert json.loads(top.stdout)["where"] == f"SLURM job {alloc}"

    assert folder_state(root) == before, "a reader wrote into the cluster folder"
    assert records.read("rd").state is ClusterState.READY  # (only shown as ended, so far)
    assert not read_job("rd", job_id).state.is_terminal()

    down = cli("down", "rd")
    assert down.returncode == 0, down.stderr
    assert records.read("rd").state is ClusterState.STOPPED
    settled = read_job("rd", job_id)
    assert settled.state is JobState.INTERRUPTED and f"allocation {alloc} ended" in settled.message
    assert queue.active("rd") == [] and [e.job_id for e in queue.waiting("rd")] == [job_id]


def test_submit_settles_first_and_refuses_an_ended_cluster(rs_home: Path) -> None:
    alloc, job_id = running_job(rs_home, "rs")
    slurm.scancel(alloc)
    wait_until(lambda: (i := slurm.job_info(alloc)) and i.state.is_terminal(), 60, "the cancel")
    again = cli("submit", "-c", "rs", "--", "python", "-c", "print(2)")
    assert again.returncode == 1 and "rs" in again.stderr, again.stderr
    assert records.read("rs").state is ClusterState.STOPPED  # (settled by the writer)
    assert read_job("rs", job_id).state is JobState.INTERRUPTED  # (back in the queue, to resume)
