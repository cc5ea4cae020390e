"""The hang corpus: healthy programs that print nothing for a long while, and hung ones, each a
small script in this folder with the verdict the hang watchdog must reach (docs/troubleshooting.md
#my-job-hangs). tests/testbed/test_hangs.py runs every CPU case as a job of a testbed cluster;
tests/gpu/suite.py's `faults` part runs them all on GPUs (`gpu` cases only there).

A healthy program prints a start line, works CORPUS_SECONDS (3 x hang_timeout or more) printing
nothing, prints a done line and exits 0; a hung one prints its start line and never ends. `where`
is what a hung job's message must say of where it waits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    name: str
    healthy: bool
    ranks: int = 1  # > 1: a `kind: spmd` torchrun job with this many processes
    gpu: bool = False  # only where GPUs are (the GPU suite)
    ray: bool = False  # a Ray driver (ray.init() joins the cluster)
    where: str = ""  # (hung) a regular expression the job's message must match

    @property
    def script(self) -> str:
        return f"{self.name}.py"


CASES = [
    Case("torch_item", True),
    Case("torch_item_toplevel", True),
    Case("torch_nosync", True),
    Case("hf_trainer", True, ranks=2),
    Case("deepspeed_zero", True, ranks=2),
    Case("matmul_chain", True),
    Case("pandas_prep", True),
    Case("mp_pool", True),
    Case("checkpoint_write", True),
    Case("ray_driver", True, ray=True),
    Case("vllm_generate", True, gpu=True),
    Case("peer_never_joins", False, ranks=2, where=r"rank 1 never arrived"),
    Case("gpu_flag_poll", False, gpu=True, where=r"waits for the GPU|gpu_flag_poll\.py:\d+"),
    Case("lock_deadlock", False, where=r"lock_deadlock\.py:\d+"),
    Case("ray_get_forever", False, ray=True, where=r"ray_get_forever\.py:\d+"),
    Case("dataloader_stuck", False, where=r"dataloader_stuck\.py:\d+"),
    Case("sleep_forever", False, where=r"sleep_forever\.py:\d+"),
    Case("poll_retry", False, where=r"poll_retry\.py:\d+"),
    Case("spin_in_call", False, where=r"running in <module> \(spin_in_call\.py:\d+\)"),
]


def cases(gpu: bool) -> list[Case]:
    """The cases for a machine with (True) or without GPUs."""
    return [c for c in CASES if gpu or not c.gpu]
