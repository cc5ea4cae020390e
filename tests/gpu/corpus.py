"""The hang corpus on GPUs (tests/hangs; the GPU suite's `faults` part runs it as FAULTS `corpus`):
every program that uses a GPU runs as a job with hang_timeout 30s. The healthy ones first, side by
side (a torch loop syncing every step and HF Trainer with logging off quiet for 3 minutes, the
others for 90 s): each SUCCEEDED, never suspected of a hang. Then each hung one alone (a GPU flag
poll; with 2 GPUs a rank whose NCCL peer never joins, spinning at 100 % GPU): FAILED `hung: ...`
within hang_timeout + 60 s of its start line, its message saying where it waits. Alone, because a
GPU's memory activity is read per GPU: a healthy neighbour on the same GPU would hide a hang."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raystack import Cluster
from raystack.client import Job
from raystack.errors import ClusterError
from raystack.store import paths
from raystack.store.ledger import JobState
from tests.hangs.cases import HERE, Case, cases

HANG = 30  # s
LONG = {"torch_item": 180, "hf_trainer": 180}  # (the two healthy runs: 3 minutes quiet)
ON_GPU = {
    "torch_item", "torch_item_toplevel", "torch_nosync", "hf_trainer", "deepspeed_zero", "matmul_chain",
    "vllm_generate", "gpu_flag_poll", "peer_never_joins",
}  # fmt: skip


def submit(cluster: Cluster, case: Case, ngpu: int) -> Job:
    sets = [
        f"name={case.name}",
        f"hang_timeout={HANG}s",
        f"env.CORPUS_SECONDS={os.environ.get('GPU_CORPUS_SECONDS') or LONG.get(case.name, 3 * HANG)}",
        "env.CORPUS_DEVICE=auto",
    ]
    if case.ranks > 1:  # (one rank per GPU, as many as there are, up to the case's)
        spmd = [f"command={case.script}", "nodes=1", f"procs_per_node={min(case.ranks, ngpu)}"]
        return cluster.submit(HERE / "spmd.yaml", sets=sets + spmd, now=True)
    sets += [f"working_dir={HERE}", "entrypoint_num_gpus=0.1"]  # (side by side on one GPU)
    return cluster.submit(["python", case.script], sets=sets, now=True)


def ended(jobs: dict[str, Job], healthy: set[str], timeout: float = 540) -> dict[str, str]:
    """Wait for every job's end; the messages of healthy jobs that were ever suspected of a hang."""
    suspected: dict[str, str] = {}
    deadline = time.time() + timeout
    while time.time() < deadline:
        records = {name: job.record() for name, job in jobs.items()}
        for name, record in records.items():
            if name in healthy and record.message.startswith("suspected"):
                suspected[name] = record.message
        if all(r.state.is_terminal() for r in records.values()):
            break
        time.sleep(1.0)
    return suspected


def keep_evidence(jobs: dict[str, Job]) -> None:
    """A healthy job that was suspected: its stack dumps, its log and its ledger into
    $OUT/corpus-suspected/<name>/ (the GPU machine is gone after the run; these say why)."""
    out = os.environ.get("OUT")
    for name, job in jobs.items() if out else []:
        folder = Path(str(out)) / "corpus-suspected" / name
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(ClusterError):  # (cleared before any dump was taken: none to keep)
            for dump in job.stacks().files:
                shutil.copy(dump, folder / dump.name)
        (folder / "job.log").write_text(job.logs()[-200_000:])
        (folder / "record.json").write_text(job.record().model_dump_json(indent=1))
        (folder / "progress.jsonl").write_text("".join(progress_rows(job)))
        for node_log in paths.cluster(job.cluster).logs.glob("node-*.log"):  # (the probe's debug lines)
            shutil.copy(node_log, folder.parent / node_log.name)


def progress_rows(job: Job) -> list[str]:
    """What every node's progress probe said of the job, sample by sample (its usage lines'
    progress rows: how many looks, when it last moved and by what, how many processes)."""
    rows = []
    for usage in sorted(paths.cluster(job.cluster).usage.glob("*.jsonl")):
        for line in usage.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                sample = json.loads(line)
                row = (sample.get("progress") or {}).get(job.id)
                if row is not None:
                    rows.append(json.dumps({"t": sample.get("t"), "file": usage.name, **row}) + "\n")
    return rows


def run_corpus(cluster: Cluster, ngpu: int, say: Callable[[str], None]) -> tuple[dict, dict, dict]:
    """figures, checks and skipped."""
    figures: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    only = [n for n in os.environ.get("GPU_CORPUS", "").split(",") if n]  # (a subset, by name)
    chosen = [c for c in cases(gpu=True) if c.name in ON_GPU and (not only or c.name in only)]
    for case in [c for c in chosen if not c.healthy and c.ranks > ngpu]:
        skipped[f"corpus {case.name}"] = f"{case.ranks} ranks need {case.ranks} GPUs"
    for name, module in (("vllm_generate", "vllm"), ("deepspeed_zero", "deepspeed")):
        if importlib.util.find_spec(module) is None:
            skipped[f"corpus {name}"] = f"{module} is not installed here (tests/gpu/stage.py)"
            chosen = [c for c in chosen if c.name != name]
    healthy = {c.name: submit(cluster, c, ngpu) for c in chosen if c.healthy}
    suspected = ended(healthy, set(healthy))
    for name, job in healthy.items():
        record = job.record()
        figures[name] = {
            "state": record.state.value,
            "ran_s": round((record.ended or 0) - (record.started or 0), 1),
        }
        say(f"corpus {name}: {record.state.value} after {figures[name]['ran_s']}s {record.message[:200]}")
    hung = {}
    for case in [c for c in chosen if not c.healthy and c.ranks <= ngpu]:
        job = submit(cluster, case, ngpu)
        ended({case.name: job}, set())
        record = job.record()
        starts = [float(t) for t in re.findall(r"CORPUS start \S+ rank=\d+ t=([\d.]+)", job.logs())]
        took = (record.ended or time.time()) - (max(starts) if starts else record.started or 0)
        hung[case.name] = ok = bool(
            record.state is JobState.FAILED
            and record.message.startswith(f"hung: no progress for {HANG}s")
            and re.search(case.where, record.message)
            and took <= HANG + 60
        )
        figures[case.name] = {"state": record.state.value, "seconds_to_failed": round(took, 1), "ok": ok}
        figures[case.name]["message"] = record.message[:500]
        say(f"corpus {case.name}: {record.state.value} in {took:.1f}s: {record.message[:300]}")
    figures["suspected_healthy"] = suspected
    keep_evidence({name: healthy[name] for name in suspected})
    checks = {
        "corpus: every healthy GPU program SUCCEEDED, never suspected of a hang": not suspected
        and all(f["state"] == "SUCCEEDED" for n, f in figures.items() if n in healthy),
        "corpus: every hung GPU program FAILED hung within hang_timeout + 60 s, where named": bool(hung)
        and all(hung.values()),
    }
    return figures, checks, skipped
