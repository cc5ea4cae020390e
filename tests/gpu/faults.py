"""The GPU suite's `faults` part: hangs and deaths as they really happen on GPUs, each followed by a
job queued behind it (tests/gpu/suite.py runs it; `run.sh --only faults`).

  hang        a 2-rank torchrun job (NCCL) whose rank 1 never joins the second all-reduce while
              rank 0 spins in it at 100 % GPU: FAILED `hung: ...` within hang_timeout + 60 s,
              naming rank 1, with both ranks' stacks and flight recorders
  oom         rank 0 asks its GPU for 1 TiB            } each FAILED within 30 s of the fault,
  kill        rank 1 SIGKILLs itself in a collective   } the rank and the cause in its message
  segv        rank 1 reads address 0                   }
  cuda-error  rank 0 triggers a device-side assert     }
  nccl-error  rank 1 joins on rank 0's GPU (ncclInvalidUsage: Duplicate GPU detected)
  engine      grpo_tiny's vLLM engine SIGKILLed 0.05 s into its generate at step 2
  corpus      the hang corpus's GPU programs (tests/gpu/corpus.py): the healthy ones SUCCEED never
              suspected of a hang, the hung ones FAIL hung in time, saying where they wait
              (GPU_CORPUS=hf_trainer,torch_item: those only; GPU_CORPUS_SECONDS: how long each works)
FAULTS=hang,oom,... runs those only (one run of the device tool lasts 10 minutes; vLLM's engine
alone takes 1.5 of them to start). Each time: the job behind it SUCCEEDED, and no process holds
GPU memory once it ran. On one GPU the 2-rank faults are skipped (two ranks need two GPUs); oom,
cuda-error and engine run with one.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from raystack import Cluster
from raystack.client import Job
from raystack.store.ledger import JobState
from tests.gpu.corpus import run_corpus

REPO = Path(__file__).resolve().parents[2]
DEBUG, GRPO = REPO / "jobs" / "debug", REPO / "jobs" / "grpo_tiny" / "grpo_tiny.yaml"
HANG = 30  # s: the hung job's hang_timeout
CASES = [  # mode, misbehaving rank, ranks needed, what the message must say
    ("hang", 1, 2, r"^hung: no progress for 30s .*rank 1 never"),
    ("oom", 0, 1, r"rank 0 exited 1: torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate 1024"),
    ("kill", 1, 2, r"rank 1 exited -9 \(killed by SIGKILL\)"),
    ("segv", 1, 2, r"rank 1 exited -11 \(killed by SIGSEGV\)"),
    ("cuda-error", 0, 1, r"rank 0 exited 1: torch\.AcceleratorError: CUDA error: device-side assert"),
    ("nccl-error", 1, 2, r"ncclInvalidUsage.*Duplicate GPU detected"),
]  # fmt: skip


def gpu_holders() -> list[str]:
    """Every process holding GPU memory now (nvidia-smi's own view, whoever started it)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def after_it(cluster: Cluster) -> Job:
    return cluster.submit(["python", "-c", "print('AFTER ok')"], sets=["name=after"])


def timed(job: Job, pattern: str) -> float | None:
    """The time the job's own line matching `pattern` (with t=EPOCH) gives."""
    found = re.search(pattern + r" t=([\d.]+)", job.logs())
    return float(found[1]) if found else None


def fault(cluster: Cluster, mode: str, rank: int, ngpu: int) -> tuple[Job, Job]:
    sets = [
        f"name=fault-{mode}",
        f"command=rankfault.py --mode {mode} --rank {rank}",
        f"procs_per_node={min(ngpu, 2)}",
        f"hang_timeout={HANG}s",
    ]
    return cluster.submit(DEBUG / "rankfault.yaml", sets=sets), after_it(cluster)


def judge(
    name: str,
    job: Job,
    after: Job,
    pattern: str,
    since: Callable[[], float | None],
    limit: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """`since`: when the fault happened, asked once the job ended (from its log)."""
    record = job.wait(timeout=600)
    behind = after.wait(timeout=600)
    start = since()
    took = (record.ended or time.time()) - start if start else None
    row = {
        "state": record.state.value,
        "message": record.message[:700],
        "seconds_to_failed": round(took, 1) if took is not None else None,
        "after": behind.state.value,
        "gpu_holders_after": gpu_holders(),
    }
    say(f"fault {name}: {record.state.value} in {row['seconds_to_failed']}s: {record.message[:300]}")
    row["ok"] = bool(
        record.state is JobState.FAILED
        and re.search(pattern, record.message)
        and took is not None
        and took <= limit
        and behind.state is JobState.SUCCEEDED
        and not row["gpu_holders_after"]
    )
    return row


def engine_death(cluster: Cluster, ngpu: int, say: Callable[[str], None]) -> dict[str, Any]:
    layout = ["plan.learners=1", "plan.engines=1"]
    if ngpu > 1:
        layout += ["plan.per_bundle=1"]
    sets = [
        "entrypoint=python grpo_tiny.py {plan.flags} --steps 4 --kill-engine-at-step 2 "
        "--learner-cpus-per-gpu 1",
        *layout,
        "name=fault-engine",
        f"outputs.checkpoints=/tmp/grpo-fault-{time.time_ns()}",
    ]
    job = cluster.submit(GRPO, sets=sets)
    after = after_it(cluster)
    job.wait(timeout=900)
    died = re.search(r"GRPO_FAULT engine pid (\d+) dies in ([\d.]+)s t=([\d.]+)", job.logs())
    since = float(died[3]) + float(died[2]) if died else None
    pattern = rf"Engine pid {died[1]}: its process died" if died else r"(?!)"
    return judge("engine", job, after, pattern, lambda: since, 30, say) | {
        "vllm": "vllm engines up" in job.logs()
    }


def run_faults(cluster: Cluster, ngpu: int, say: Callable[[str], None]) -> tuple[dict, dict, dict]:
    """figures, checks and skipped of the part."""
    figures: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    skipped: dict[str, str] = {}
    chosen = (os.environ.get("FAULTS") or ",".join([c[0] for c in CASES] + ["engine", "corpus"])).split(",")
    if "corpus" in chosen:
        found, ok, skip = run_corpus(cluster, ngpu, say)
        figures["corpus"], checks, skipped = found, {**checks, **ok}, {**skipped, **skip}
    for mode, rank, needs, pattern in CASES:
        if mode not in chosen:
            continue
        if needs > ngpu:
            skipped[f"fault {mode}"] = f"{needs} ranks need {needs} GPUs (one rank per GPU)"
            continue
        job, after = fault(cluster, mode, rank, ngpu)
        if mode == "hang":
            since = first_line(job)
            row = judge(mode, job, after, pattern, partial(float, since or 0), HANG + 60, say)
            row["stacks"] = [p.name for p in job.stacks().files]
            flight = job.stacks().folder.parent / "flight"
            row["flight_recorder_dumps"] = (
                sorted(p.name for p in flight.glob("rank_*")) if flight.is_dir() else []
            )
            row["names_rank_0_waiting"] = "rank 0 waits" in job.record().message
            checks["fault hang: FAILED hung within hang_timeout + 60 s, rank 1 named, stacks kept"] = (
                row["ok"] and len(row["stacks"]) >= 2
            )
        else:
            row = judge(mode, job, after, pattern, partial(timed, job, rf"RANKFAULT fault {mode}"), 30, say)
            checks[f"fault {mode}: FAILED within 30 s, the cause in the message, the next job ran"] = row[
                "ok"
            ]
        figures[mode] = row
    if "engine" not in chosen:
        return figures, checks, skipped
    row = engine_death(cluster, ngpu, say)
    figures["engine"] = row
    checks["fault engine: a vLLM engine killed mid-step fails the run within 30 s, named"] = row["ok"]
    if not row.get("vllm"):
        skipped["fault engine with vLLM"] = "vLLM is not installed here (tests/gpu/stage.py installs it)"
    return figures, checks, skipped


def first_line(job: Job) -> float | None:
    deadline = time.time() + 300
    while time.time() < deadline and not job.record().state.is_terminal():
        if "RANKFAULT first" in job.logs():
            return time.time()
        time.sleep(0.5)
    return None
