"""The local SLURM testbed is a real SLURM: real slurmctld/slurmd, real srun, real GRES."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from raystack.adapters import slurm
from raystack.errors import SchedulerError

from ..conftest import NODES, wait_until

pytestmark = pytest.mark.testbed


def run_batch(home: Path, script: str, *options: str, timeout: float = 60) -> tuple[slurm.AllocInfo, str]:
    path = home / f"job-{len(list(home.glob('job-*')))}.sh"
    path.write_text("#!/bin/bash\n" + script)
    out = home / f"{path.stem}.out"
    job_id = slurm.sbatch([*options, f"--output={out}"], str(path))
    info = wait_until(
        lambda: (i := slurm.job_info(job_id)) and i.state.is_terminal() and i,
        timeout,
        f"job {job_id} to finish",
    )
    return info, out.read_text()  # type: ignore[return-value]


def test_sinfo_shows_every_node_idle_with_four_gpus(testbed: Path) -> None:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t %G"], capture_output=True, text=True, check=True)
    rows = [line.split() for line in out.stdout.splitlines()]
    assert sorted(r[0] for r in rows) == sorted(f"node{i}" for i in range(1, NODES + 1))
    assert all(r[2] == "gpu:4" for r in rows)


def test_srun_runs_one_task_on_each_node(rs_home: Path) -> None:
    info, out = run_batch(
        rs_home,
        "srun --ntasks-per-node=1 bash -c 'echo \"$(hostname) $(hostname -I) $SLURM_NODEID\"'\n",
        f"--nodes={NODES}",
        "--ntasks-per-node=1",
    )
    assert info.native == "COMPLETED", out
    rows = sorted(line.split() for line in out.splitlines())
    assert len(rows) == NODES
    assert len({r[0] for r in rows}) == NODES, "tasks must land on distinct hosts"
    assert len({r[1] for r in rows}) == NODES, "each node must have its own address"
    assert sorted(int(r[2]) for r in rows) == list(range(NODES))


def test_gres_gpus_are_granted_and_visible(rs_home: Path) -> None:
    info, out = run_batch(
        rs_home,
        "srun bash -c 'echo \"$CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE\"'\n",
        "--nodes=1",
        "--gres=gpu:4",
    )
    assert info.native == "COMPLETED", out
    assert out.split() == ["0,1,2,3", "4"]


def test_job_larger_than_cluster_is_refused_with_slurms_error(testbed: Path) -> None:
    script = testbed / "refused.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(SchedulerError, match="Batch job submission failed: Node count specification invalid"):
        slurm.sbatch([f"--nodes={NODES + 1}"], str(script))
    with pytest.raises(SchedulerError, match="Requested node configuration is not available"):
        slurm.sbatch(["--nodes=1", "--gres=gpu:5"], str(script))


def test_failed_job_state_and_reason_are_reported(rs_home: Path) -> None:
    info, _ = run_batch(rs_home, "exit 3\n", "--nodes=1")
    assert info.native == "FAILED"
    assert info.reason == "NonZeroExitCode"


def test_hostnames_expands_slurm_node_lists(testbed: Path) -> None:
    assert slurm.hostnames("node[1-3],node7") == ["node1", "node2", "node3", "node7"]
