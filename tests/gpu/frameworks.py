"""The frameworks part of the GPU suite (issue: the frameworks researchers really run).

Through raystack, on the suite's one cluster, back to back: verl's own GRPO trainer twice
(jobs/grpo_tiny/verl_grpo.yaml: `python -m verl.trainer.main_ppo` with its Hydra overrides, vLLM
rollouts colocated with the FSDP actor on every GPU, the planner's nnodes/GPUs/TP), then TRL's
GRPOTrainer with vLLM in colocate mode (jobs/grpo_tiny/trl_grpo.yaml: accelerate + DeepSpeed
ZeRO-2, one process per GPU). After each: SUCCEEDED, the reward logged, no process holding GPU
memory. Then, with the cluster down (`native`), each framework started its own documented way in
the same run: verl's entrypoint as a plain process (its own ray.init() starts a fresh local Ray),
TRL under `accelerate launch`; the per-step time (median after the first step) through raystack
over the native one is the figure (target: native / raystack >= 0.97).

Needs the frameworks set staged (tests/gpu/stage.py --set frameworks: /tmp/site-frameworks).
FRAMEWORKS=verl,trl picks the cases (default: both, verl twice). One device run lasts 10 minutes:
FRAMEWORKS_NATIVE=no leaves the native runs out, and a later run on the same warm machine with
FRAMEWORKS_NATIVE=only runs them against the figures the first one kept (SAVED). With
GPU_SUITE_KEEP=1 (suite.py) the cluster and the figures carry over from run to run, one device
run each (a verl run takes 5-6 minutes here):
    export GPU_SUITE_KEEP=1 FRAMEWORKS_NATIVE=no FRAMEWORKS_VERL_RUNS=1
    FRAMEWORKS=verl bash tests/gpu/run.sh --only frameworks     # twice: verl-0, verl-1
    FRAMEWORKS=trl bash tests/gpu/run.sh --only frameworks      # trl-2, on the same cluster
then `RAYSTACK_HOME=/tmp/rs-gpu-kept raystack down gpu` and, without GPU_SUITE_KEEP,
`FRAMEWORKS_NATIVE=only bash tests/gpu/run.sh --only frameworks` for the natives.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raystack import Cluster
from raystack.allocation.node.gpus import gpu_processes
from raystack.store.ledger import JobState

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "jobs" / "grpo_tiny"
VERL, TRL = TINY / "verl_grpo.yaml", TINY / "trl_grpo.yaml"
TRL_STEPS = 12
TRL_ENV = "/tmp/site-frameworks/trl-env"
TRL_GPU = ["--use_vllm=True", "--vllm_mode=colocate", "--vllm_gpu_memory_utilization=0.2"]
SAVED = Path("/tmp/raystack-frameworks.json")  # (figures and checks, for a FRAMEWORKS_NATIVE=only run)
STEP_LINE = re.compile(r"\bstep:(\d+) - .*")
NUMBER = re.compile(r"(?:np\.\w+\()?([-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))\)?")


def verl_steps(log: str) -> list[dict[str, float]]:
    """verl's console logger: one `step:N - key:value - ...` line per training step (values as
    pprint writes them: `0.25`, or `np.float64(2.0)` for numpy scalars)."""
    steps = []
    for line in log.splitlines():
        if m := STEP_LINE.search(line):
            step: dict[str, float] = {}
            for kv in m.group(0).split(" - "):
                key, _, value = kv.partition(":")
                if number := NUMBER.fullmatch(value.strip()):
                    step[key] = float(number.group(1))
            steps.append(step)
    return steps


def verl_figures(log: str) -> dict[str, Any]:
    steps = verl_steps(log)
    times = [s["timing_s/step"] for s in steps if "timing_s/step" in s]
    return {
        "steps": len(steps),
        "scores": [round(s.get("critic/score/mean", float("nan")), 3) for s in steps],
        "step_s_median": round(statistics.median(times[1:] or times), 4) if times else None,
    }


def ran(log: str) -> str:
    """The entrypoint as Ray's job supervisor ran it (the plan's flags filled in at start)."""
    for line in log.splitlines():
        if line.startswith("Running entrypoint for job "):
            return line.split(": ", 1)[1]
    return ""


def trl_command(ngpu: int) -> str:
    """trl_grpo.yaml's command with TRL's own flags for vLLM colocated and fewer steps."""
    import yaml

    command = yaml.safe_load(TRL.read_text())["command"].replace("--max_steps 30", f"--max_steps {TRL_STEPS}")
    return " ".join([command, *TRL_GPU])


def trl_path() -> str:
    """TRL in a folder of its own (stage.py APART): verl breaks where TRL 1.16 is importable."""
    return os.pathsep.join([TRL_ENV, os.environ.get("PYTHONPATH", "")])


def marker(text: str, tag: str) -> dict:
    """The JSON after `tag ` on the last line that has it (a `[node r] ` prefix allowed)."""
    lines = [ln.split(tag + " ", 1)[1] for ln in text.splitlines() if tag + " " in ln]
    if not lines:
        raise KeyError(f"no {tag} line")
    return json.loads(lines[-1])


def run_frameworks(
    cluster: Cluster, ngpu: int, say: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, bool], dict[str, str]]:
    """verl twice, then TRL, through raystack: figures, checks, and what was skipped."""
    if os.environ.get("FRAMEWORKS_NATIVE") == "only":
        kept = json.loads(SAVED.read_text())
        say(f"the raystack runs of an earlier run: {sorted(kept['figures'])}")
        return kept["figures"], kept["checks"], {}
    cases = os.environ.get("FRAMEWORKS", "verl,trl").split(",")
    figures: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    if os.environ.get("GPU_SUITE_KEEP") == "1" and SAVED.exists():  # (runs before, on the kept cluster)
        kept = json.loads(SAVED.read_text())
        figures, checks = kept["figures"], kept["checks"]
    out = Path(f"/tmp/frameworks-{os.getpid()}")
    verl_runs = int(os.environ.get("FRAMEWORKS_VERL_RUNS", "2"))
    runs = (["verl"] * verl_runs if "verl" in cases else []) + (["trl"] if "trl" in cases else [])
    previous_end = 0.0
    for i, case in enumerate(runs, start=len(figures)):
        name = f"{case}-{i}"
        if case == "verl":
            job = cluster.submit(VERL, sets=[f"outputs.run={out / name}", f"name={name}"])
        else:
            job = cluster.submit(
                TRL,
                sets=[
                    "nodes=1", f"procs_per_node={ngpu}", f"command={trl_command(ngpu)}",
                    f"env.PYTHONPATH={trl_path()}", f"outputs.run={out / name}", f"name={name}",
                ],
            )  # fmt: skip
        record = job.wait(timeout=900)
        log = job.logs()
        if os.environ.get("OUT"):  # (kept even where the device run ends at its time limit)
            (Path(os.environ["OUT"]) / f"{name}.log").write_text(log)
        took = (record.ended or 0) - (record.started or 0)
        say(f"{name} ({job.id}): {record.state.value} in {took:.1f}s {record.message[:300]}")
        ok = record.state is JobState.SUCCEEDED
        checks[f"{name} through raystack SUCCEEDED"] = ok
        if not ok:
            print(log[-8000:], flush=True)
            continue
        time.sleep(2)
        held = gpu_processes()
        checks[f"{name}: no process holds a GPU after it"] = not held
        checks[f"{name}: started after the job before it ended"] = (record.started or 0) >= previous_end
        previous_end = record.ended or 0
        if case == "verl":
            found = verl_figures(log)
            found["entrypoint"] = ran(log)
            checks[f"{name}: verl logged every step's reward"] = found["steps"] >= 6 and bool(found["scores"])
            checks[f"{name}: verl ran the planner's flags"] = (
                f"trainer.n_gpus_per_node={ngpu}" in found["entrypoint"]
            )
        else:
            found = marker(log, "TRL_GRPO")
            checks[f"{name}: TRL generated with vLLM (colocate) and logged its reward"] = (
                found.get("vllm_mode") == "colocate" and len(found.get("rewards", [])) == TRL_STEPS
            )
            checks[f"{name}: effective batch = the plan's (64)"] = found.get("effective_batch") == 64
        figures[name] = found
        say(f"{name}: {json.dumps({k: v for k, v in found.items() if k != 'entrypoint'})}")
    SAVED.write_text(json.dumps({"figures": figures, "checks": checks}))
    return figures, checks, {}


def native(figures: dict[str, Any], ngpu: int, say: Callable[[str], None]) -> dict[str, bool]:
    """Each framework its own documented way (no raystack, no cluster), same settings, and the
    per-step ratio: native step time over raystack's (>= 0.97: raystack costs the steps nothing)."""
    checks: dict[str, bool] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYSTACK_"))}
    verl = figures.get("verl-1") or figures.get("verl-0")
    if verl:
        out = Path(f"/tmp/verl-native-{os.getpid()}")
        t0 = time.monotonic()
        proc = subprocess.run(
            ["bash", "-c", verl["entrypoint"]], cwd=TINY, env={**env, "RAYSTACK_OUTPUT_RUN": str(out)},
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        found = verl_figures(proc.stdout + proc.stderr)
        say(f"verl native: exit {proc.returncode} in {time.monotonic() - t0:.1f}s, {found}")
        if proc.returncode:
            print((proc.stdout + proc.stderr)[-6000:], flush=True)
        checks["verl native (its own ray.init) SUCCEEDED"] = proc.returncode == 0
        figures["verl-native"] = found
        if found["step_s_median"] and verl["step_s_median"]:
            ratio = found["step_s_median"] / verl["step_s_median"]
            figures["verl_native_over_raystack_step"] = round(ratio, 3)
            checks["verl: native step / raystack step >= 0.97"] = ratio >= 0.97
    trl = figures.get("trl-2") or figures.get("trl-0")
    if trl:
        flags = shlex.split(trl_command(ngpu).split("trl_grpo.py", 1)[1])
        flags = [
            f.replace("{plan.micro_batch}", str(trl["per_device_train_batch_size"])).replace(
                "{plan.grad_accum}", str(trl["gradient_accumulation_steps"])
            )
            for f in flags
        ]
        launch = [
            sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(ngpu),
            "--num_machines", "1", "--use_deepspeed", "--deepspeed_config_file", "ds_zero2.json",
            "trl_grpo.py", "--dir", f"/tmp/trl-native-{os.getpid()}", *flags,
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(
            launch,
            cwd=TINY,
            env={**env, "PYTHONPATH": trl_path()},
            capture_output=True,
            text=True,
            timeout=900,
        )
        say(f"trl native: exit {proc.returncode} in {time.monotonic() - t0:.1f}s")
        if proc.returncode:
            print((proc.stdout + proc.stderr)[-6000:], flush=True)
        checks["TRL native (accelerate launch) SUCCEEDED"] = proc.returncode == 0
        if proc.returncode == 0:
            found = marker(proc.stdout, "TRL_GRPO")
            figures["trl-native"] = found
            ratio = found["step_s_median"] / trl["step_s_median"]
            figures["trl_native_over_raystack_step"] = round(ratio, 3)
            checks["TRL: native step / raystack step >= 0.97"] = ratio >= 0.97
    return checks
