"""The launchers' command lines and the failure parser (pure; the testbed runs them for real)."""

from __future__ import annotations

import pytest

from raystack.launch.launchers import Rendezvous, argv, failure, hostfile, wants_multi_gpu


def rdv(node_rank: int = 1, nnodes: int = 2, procs: int = 4, gpus: bool = True) -> Rendezvous:
    return Rendezvous(nnodes, node_rank, procs, "10.0.0.1", 29500, ("n0", "n1")[:nnodes], gpus)


def test_torchrun_gets_the_static_rendezvous_then_the_command_verbatim() -> None:
    line = argv("torchrun", rdv(), ["train.py", "--lr", "1e-6"], ["--max_restarts=0"])
    assert line == [
        "torchrun",
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=4",
        "--master_addr=10.0.0.1",
        "--master_port=29500",
        "--max_restarts=0",
        "train.py",
        "--lr",
        "1e-6",
    ]


def test_deepspeed_runs_without_ssh_from_a_generated_hostfile() -> None:
    line = argv("deepspeed", rdv(), ["train.py"], [], hostfile="/tmp/h")
    assert line[:3] == ["deepspeed", "--hostfile=/tmp/h", "--no_ssh"]
    assert "--node_rank=1" in line and "--num_nodes=2" in line and "--num_gpus=4" in line
    assert line[-1] == "train.py"
    assert hostfile(rdv()) == "n0 slots=4\nn1 slots=4\n"


@pytest.mark.parametrize(
    ("extra", "gpus", "procs", "nnodes", "multi"),
    [
        ([], True, 4, 2, True),
        ([], False, 4, 2, False),  # CPU: accelerate must not be told --multi_gpu
        ([], True, 1, 1, False),  # one process: nothing to distribute
        (["--config_file=deepspeed.yaml"], True, 4, 2, False),  # the file decides (DEEPSPEED)
        (["--config_file", "ds.yaml"], True, 4, 2, False),
        (["--use_deepspeed", "--zero_stage=3"], True, 4, 2, False),
        (["--use_fsdp"], True, 4, 2, False),
        (["--mixed_precision=bf16"], True, 4, 2, True),  # not a distribution choice
    ],
)
def test_accelerate_adds_multi_gpu_only_when_nothing_else_chooses(
    extra: list[str], gpus: bool, procs: int, nnodes: int, multi: bool
) -> None:
    r = rdv(node_rank=0, nnodes=nnodes, procs=procs, gpus=gpus)
    assert wants_multi_gpu(r, extra) is multi
    line = argv("accelerate", r, ["train.py"], extra)
    assert line[:2] == ["accelerate", "launch"]
    assert f"--num_processes={nnodes * procs}" in line and f"--num_machines={nnodes}" in line
    assert ("--multi_gpu" in line) is (multi or "--multi_gpu" in extra)
    assert line[-1] == "train.py"


def test_an_unknown_launcher_is_refused() -> None:
    with pytest.raises(ValueError, match="torchrun, deepspeed, accelerate"):
        argv("mpirun", rdv(), ["x"], [])


def test_failure_reads_torchruns_root_cause() -> None:
    lines = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-22_10:00:00",
        "  host      : n1",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 3 (pid: 123)",
    ]
    assert failure(lines, 1) == (3, 3)


def test_failure_reads_deepspeeds_return_code_and_falls_back_to_the_launchers() -> None:
    assert failure(["[rank5] boom", "exits with return code = 7"], 1) == (5, 7)
    assert failure(["nothing useful"], 2) == (None, 2)
