"""The launchers' command lines and the failure parser (pure; the testbed runs them for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.launch.launchers import (
    Rendezvous,
    argv,
    cause,
    exit_words,
    failure,
    hostfile,
    noise,
    shell_exit_words,
    wants_multi_gpu,
)


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


def test_each_rank_writes_its_own_files_unless_the_user_chose() -> None:
    line = argv("torchrun", rdv(), ["t.py"], ["--max_restarts=0"], logdir="/tmp/r")
    assert line[6:9] == ["--redirects=3", "--log-dir=/tmp/r", "--max_restarts=0"]
    assert "--enable_each_rank_log=/tmp/r" in argv("deepspeed", rdv(), ["t.py"], [], "/h", "/tmp/r")
    assert "--tee=3" in argv("accelerate", rdv(), ["t.py"], [], logdir="/tmp/r")
    mine = argv("torchrun", rdv(), ["t.py"], ["--tee", "1"], logdir="/tmp/r")
    assert not any(a.startswith(("--redirects", "--log-dir")) for a in mine)


def test_rank_files_name_their_global_rank() -> None:
    from raystack.launch.launchers import rank_of

    torch_file = "/tmp/r/none_abc/attempt_0/1/stdout.log"
    assert rank_of(torch_file, node_rank=2, procs=4) == 9
    assert rank_of("/tmp/r/20261124031500_rank5.log", node_rank=1, procs=4) == 5
    assert rank_of("/tmp/r/none_abc/attempt_0/1/error.json", 0, 4) is None


def test_a_node_launcher_passes_whole_lines_of_ranks_that_write_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """cde9410: torchrun with 2 processes per node: `... ok=TrueSPMD rank=1 ...` in the job's log
    (two ranks' prints, each written as text then newline, met in one pipe)."""
    import sys

    from raystack.launch.spmd import NodeLauncherImpl
    from raystack.waiting import poll_until

    script = tmp_path / "fake_launcher.py"
    script.write_text(
        "import os, sys, subprocess\n"
        "d = sys.argv[1]\n"
        "procs = []\n"
        "for k in range(2):\n"
        "    out = os.path.join(d, 'run', 'attempt_0', str(k))\n"
        "    os.makedirs(out, exist_ok=True)\n"
        "    code = ('import os\\nfor i in range(300):\\n'\n"
        "            '    os.write(1, b\"SPMD rank=%d i=%d ok=True\" % (' + str(k) + ', i))\\n'\n"
        "            '    os.write(1, b\"\\\\n\")\\n')\n"
        "    procs.append(subprocess.Popen([sys.executable, '-c', code],"
        " stdout=open(os.path.join(out, 'stdout.log'), 'wb')))\n"
        "print('launcher says hello', flush=True)\n"
        "sys.exit(max(p.wait() for p in procs))\n"
    )
    node = NodeLauncherImpl(node_rank=1)
    node.start([sys.executable, str(script), node.logdir], {}, procs=2)
    got: list = []

    def done() -> bool:
        lines, code = node.poll()
        got.extend(lines)
        return code is not None

    poll_until(done, 30, "the fake launcher to end")
    got.extend(node.poll()[0])
    ranks = [(rank, text) for rank, text in got if rank is not None]
    assert (None, "launcher says hello") in got
    assert len(ranks) == 600 and {r for r, _ in ranks} == {2, 3}  # node 1, 2 per node: ranks 2 and 3
    for rank, text in ranks:  # whole lines, each with the rank that wrote it
        assert text == f"SPMD rank={rank - 2} i={text.split('i=')[1].split()[0]} ok=True"


def test_exit_words_name_the_signal_that_killed_a_rank() -> None:
    assert exit_words(3) == "3"
    assert exit_words(-6) == "-6 (killed by SIGABRT)"
    assert exit_words(-9) == "-9 (killed by SIGKILL)"
    assert exit_words(-200) == "-200"  # no such signal: the number as given


def test_a_shells_exit_status_names_the_signal() -> None:
    assert shell_exit_words(137) == "137 (killed by SIGKILL, most often the out-of-memory killer)"
    assert shell_exit_words(139) == "139 (killed by SIGSEGV)"
    assert [shell_exit_words(c) for c in (0, 3, 128, 255)] == ["0", "3", "128", "255"]


GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def torchrun_tail(name: str, rank: int) -> list[str]:
    """A launcher's tail as the node's actor keeps it: the failing rank's own lines (recorded on 2 x
    H100 under plain torchrun, tests/fixtures/gpu) tagged with its rank, then torchrun's summary."""
    text = (GPU / f"torchrun-{name}.txt").read_text().splitlines()
    cut = next(i for i, ln in enumerate(text) if "Sending process" in ln or "failed (exitcode" in ln)
    own = [f"[rank{rank}] {ln}" for ln in text[:cut] if "run.py:" not in ln]
    return own + text[cut:]


@pytest.mark.parametrize(
    ("name", "rank", "code", "says"),
    [
        (
            "oom",
            0,
            1,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total "
            "capacity of 79.18 GiB of which 78.66 GiB is free.",
        ),
        ("assert", 0, 1, "torch.AcceleratorError: CUDA error: device-side assert triggered"),
        (
            "dup",
            0,
            1,
            "torch.distributed.DistBackendError: NCCL error in: "
            "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with "
            "NCCL_DEBUG=WARN for details), NCCL version 2.28.9 (ncclInvalidUsage; "
            "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60)",
        ),
        ("segv", 1, -11, ""),
        ("kill", 1, -9, ""),
    ],
)
def test_the_cause_of_a_ranks_death_is_its_own_error_line(name: str, rank: int, code: int, says: str) -> None:
    """2 x H100: the job's message said only 'node 0 rank 0 exited 1'; the line that says why was in
    the log only."""
    tail = torchrun_tail(name, rank)
    assert failure(tail, 1) == (rank, code)
    assert cause(tail, rank) == says
    assert not noise(says, code)


def test_the_echo_of_another_ranks_failure_is_noise() -> None:
    echo = (
        "torch.distributed.DistBackendError: NCCL error ... ncclRemoteError: A call failed possibly "
        "due to a network error or a remote process exiting prematurely."
    )
    assert noise(echo, 1) and noise("", -15) and noise("", 143)
    assert not noise("torch.OutOfMemoryError: CUDA out of memory.", 1)
    assert cause(["[rank2] Fatal Python error: Segmentation fault", "[rank3] boom"], 2) == (
        "Fatal Python error: Segmentation fault"
    )
    assert cause(["[rank1] nothing to see"], 1) == "" and cause(["x"], None) == ""


def test_torchs_own_rank_prefix_is_not_part_of_the_cause() -> None:
    """2 x H100 through raystack: the ranks' lines came as `[rank0]: torch.distributed...` (torch's
    prefix of a rank's error output), and the NCCL code and its last error went unsaid."""
    tail = [
        "[rank0] [rank0]: Traceback (most recent call last):",
        '[rank0] [rank0]:   File "rankfault.py", line 109, in main',
        "[rank0] [rank0]: torch.distributed.DistBackendError: NCCL error in: NCCLUtils.cpp:93, invalid usage",
        "[rank0] [rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        "[rank0] [rank0]: Last error:",
        "[rank0] [rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60",
    ]
    assert cause(tail, 0) == (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.cpp:93, invalid usage "
        "(ncclInvalidUsage; Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60)"
    )
