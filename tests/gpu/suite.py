"""The GPU suite: every job kind on one GPU machine's local cluster, with figures beside their
baselines measured in the same run. Run by tests/gpu/run.sh (one command; see its header).

In one `raystack up --local` cluster, queued back to back: hello, allreduce (NCCL, one actor per
GPU), zero3 (CUDA, against its single-process reference), grpo_tiny (vLLM engines where
vLLM is installed: tests/gpu/stage.py; one GPU shared by a learner and an engine, or NCCL weight
sync between GPUs), the SPMD torchrun debug job, and an open-instruct-shaped
placement check. Then the figures:
  allreduce   bus bandwidth through raystack (Ray actors; the SPMD torchrun job) vs plain torchrun
              of the same all-reduce on the same GPUs (target >= 0.97)
  torchrun    the same all-reduce under plain torchrun (the baseline above), and the SPMD job's
              launch: submit -> the last rank's first line through raystack vs the same torchrun
              started by hand, and Ray's own job floor (issue 43's 1.1x; a figure, not a check)
  start       submit -> the entrypoint's first line, raystack's queue vs Ray's SDK submit of the
              same job on the same cluster (target <= 1.1x), and the queue's gap between jobs
  zero3       step time and peak GPU memory of a bf16 ZeRO-3 MLP vs `raystack plan memory`
  grpo_tiny   step time split (generation / training / weight sync) on GPUs (the CPU figures come
              from the testbed: a GPU machine cannot hide its GPUs from Ray's workers)
  monitor     `raystack top` and `raystack report` under a job keeping every GPU busy (burn
              --gpus): each GPU's utilisation and memory, as nvidia-smi's own reading beside them
  faults      real hangs and deaths (tests/gpu/faults.py): a hung NCCL collective, an OOM, a
              killed or segfaulting rank, a CUDA and an NCCL error, a vLLM engine killed mid-step:
              each FAILED in time with its cause, the job behind it SUCCEEDED, no GPU held
  canary      (every run) the interconnect canary's all-reduce at READY and NCCL's transports
`--only grpo,monitor` runs just those parts (PARTS; device time is scarce, and one run of the tool
lasts at most 10 minutes: on 2 or 4 GPUs run `--only jobs,torchrun,grpo`, then
`--only start,zero3,monitor`).
Then `down`: no process of the cluster left, none holding a GPU. Writes bench/results/gpu_suite.*
(and $OUT/ when set). Exit 0 only if every job SUCCEEDED and every check holds.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from raystack import Cluster  # noqa: E402
from raystack.adapters import local  # noqa: E402
from raystack.allocation.node.gpus import gpu_processes  # noqa: E402
from raystack.client import Job  # noqa: E402
from raystack.plan.memory import Model, learner_memory  # noqa: E402
from raystack.store.ledger import JobState  # noqa: E402
from tests.gpu.faults import run_faults  # noqa: E402
from tests.gpu.frameworks import marker, native, run_frameworks  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))  # (queue_gap: the gap's figures, as the testbed's bench)

DEBUG = REPO / "jobs" / "debug"
GRPO = REPO / "jobs" / "grpo_tiny" / "grpo_tiny.yaml"
AR_MB, AR_ITERS = 1024, 20
ZERO3_BENCH = {"hidden": 8192, "layers": 8, "steps": 8, "global_batch": 64}
FIRST = "import time; print('FIRST_LINE', time.time(), flush=True)"
PARTS = [
    "jobs",
    "torchrun",
    "start",
    "zero3",
    "grpo",
    "monitor",
    "faults",
    "frameworks",
]  # in the order a full run takes them
checks: dict[str, bool] = {}
figures: dict[str, Any] = {}
skipped: dict[str, str] = {}  # what this machine's GPU count cannot show, and why


def say(text: str) -> None:
    print(f"[suite {time.strftime('%H:%M:%S')}] {text}", flush=True)


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "raystack.cli", *args], capture_output=True, text=True)
    if check and proc.returncode:
        raise SystemExit(f"raystack {' '.join(args)}: {proc.stderr[-2000:]}")
    return proc


def run(cluster: Cluster, spec: Any, sets: list[str] | None = None, timeout: float = 900) -> tuple[Job, str]:
    job = cluster.submit(spec, sets=sets or [])
    record = job.wait(timeout=timeout)
    log = job.logs()
    took = (record.ended or 0) - (record.started or 0)
    say(f"{job.id}: {record.state.value} in {took:.1f}s {record.message[:200]}")
    checks[f"{record.name} SUCCEEDED"] = record.state is JobState.SUCCEEDED
    if record.state is not JobState.SUCCEEDED:
        print(log[-5000:])
    return job, log


def guarded(name: str, fn: Any, *args: Any) -> Any:
    """A figure's failure is a failed check, not the end of the suite."""
    try:
        return fn(*args)
    except Exception as exc:  # report and go on: device time is scarce
        say(f"{name}: {type(exc).__name__}: {exc}")
        checks[f"{name} ran"] = False
        return None


# ---------------------------------------------------------------------------- the jobs
def jobs(cluster: Cluster, ngpu: int) -> None:
    _, log = run(cluster, DEBUG / "hello.yaml")
    checks["hello sees every GPU"] = marker(log, "HELLO")["gpus"] == ngpu
    _, log = run(
        cluster,
        DEBUG / "allreduce.yaml",
        [f"entrypoint=python allreduce.py --size-mb {AR_MB} --iters {AR_ITERS}"],
    )
    ar = marker(log, "ALLREDUCE")
    checks["allreduce: NCCL over every GPU, right sum"] = (
        ar["backend"] == "nccl" and ar["world"] == ngpu and ar["all_ok"]
    )
    figures["allreduce_ray_actors_busbw_gbps"] = ar.get("busbw_gb_s")
    _, log = run(
        cluster,
        DEBUG / "zero3.yaml",
        [f"entrypoint=python zero3.py --steps 5 --learners {ngpu} --strategy PACK"],
    )
    z3 = marker(log, "ZERO3")
    checks["zero3 on CUDA matches its reference"] = z3["matches_reference"] and all(
        d.startswith("cuda") for d in z3["devices"]
    )
    if ngpu > 1:
        checks["zero3 on CUDA: parameters sharded over the learners"] = z3["sharded"]
    else:
        skipped["zero3 sharding"] = "one GPU: one learner holds every shard"
    _, log = run(
        cluster, DEBUG / "spmd.yaml", [f"command=spmd.py --steps 3 --allreduce-mb {AR_MB} --iters {AR_ITERS}"]
    )
    ranks = ranks_of(log)
    checks["spmd torchrun: every rank, its own GPU"] = sorted(r["rank"] for r in ranks) == list(
        range(ngpu)
    ) and all(len(r["cuda_visible_devices"].split(",")) == ngpu for r in ranks)
    figures["allreduce_spmd_torchrun_busbw_gbps"] = marker(log, "SPMD_ALLREDUCE")["busbw_gb_s"]
    _, log = run(cluster, DEBUG / "placement.yaml")
    checks["placement: every actor sees exactly its own GPU"] = marker(log, "PLACEMENT")["ok"]


def ranks_of(text: str) -> list[dict[str, Any]]:
    """What each rank of jobs/debug/spmd.py reported of itself (its SPMD_RANK lines)."""
    return [json.loads(ln.split("SPMD_RANK ", 1)[1]) for ln in text.splitlines() if "SPMD_RANK " in ln]


def plain_torchrun(ngpu: int) -> None:
    """The same all-reduce under torchrun started by hand, on the same GPUs, outside Ray."""
    if ngpu < 2:
        skipped["allreduce vs plain torchrun"] = "one GPU: an all-reduce moves no data to compare"
        return
    proc = subprocess.run(
        [shutil.which("torchrun") or "torchrun", "--standalone", f"--nproc_per_node={ngpu}", "spmd.py",
         "--steps", "1", "--allreduce-mb", str(AR_MB), "--iters", str(AR_ITERS)],
        cwd=DEBUG, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    figures["allreduce_plain_torchrun_busbw_gbps"] = marker(proc.stdout, "SPMD_ALLREDUCE")["busbw_gb_s"]
    base = figures["allreduce_plain_torchrun_busbw_gbps"]
    for key in ("allreduce_ray_actors_busbw_gbps", "allreduce_spmd_torchrun_busbw_gbps"):
        if figures.get(key):
            figures[key.replace("_busbw_gbps", "_vs_torchrun")] = round(figures[key] / base, 4)
    if "allreduce_ray_actors_busbw_gbps" in figures:  # (the jobs part ran: its figure to compare)
        checks["allreduce through raystack >= 0.97 of plain torchrun"] = (
            figures.get("allreduce_ray_actors_vs_torchrun", 0) >= 0.97
        )


def spmd_launch(cluster: Cluster, ngpu: int, repeats: int = 3) -> None:
    """Submit -> the last rank's first line (its process group up, an all-reduce done) of the SPMD
    torchrun job through raystack, against the same torchrun started by hand (what srun starts on
    a SLURM node) and Ray's own job floor (queue_gap.floor), alternating in the same run (issue 43:
    target 1.1x; bench/spmd_launch.py measures the same on the testbed against srun)."""
    import queue_gap

    def last_rank(text: str) -> float:
        stamps = [r["t"] for r in ranks_of(text)]
        if len(stamps) != ngpu:
            raise RuntimeError(f"{len(stamps)} of {ngpu} ranks reported:\n{text[-2000:]}")
        return max(stamps)

    ours, plain, floor, hosts = [], [], [], []
    for _ in range(repeats):
        t0 = time.time()
        job, log = run(cluster, DEBUG / "spmd.yaml", ["command=spmd.py --steps 1", "name=launch"])
        hosts.append("on the cluster's launch hosts" in log)
        ours.append(last_rank(log) - t0)
        started = (job.record().started or t0) - t0  # (the driver RUNNING in Ray)
        said = [ln for ln in log.splitlines() if ln.startswith("raystack spmd: torchrun")]
        say(f"launch: RUNNING after {started:.2f}s, last rank's first line {ours[-1]:.2f}s; {said}")
        t0 = time.time()
        proc = subprocess.run(
            [shutil.which("torchrun") or "torchrun", "--standalone", f"--nproc_per_node={ngpu}",
             "spmd.py", "--steps", "1"],
            cwd=DEBUG, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        plain.append(last_rank(proc.stdout) - t0)
        floor += queue_gap.floor(cluster, 1)
    med = {k: statistics.median(v) for k, v in (("ours", ours), ("plain", plain), ("floor", floor))}
    figures["spmd_launch_raystack_s"] = [round(x, 3) for x in ours]
    figures["spmd_launch_torchrun_s"] = [round(x, 3) for x in plain]
    figures["spmd_launch_ray_floor_s"] = [round(x, 3) for x in floor]
    figures["spmd_launch_ratio"] = round(med["ours"] / med["plain"], 3)
    figures["spmd_launch_less_ray_floor_ratio"] = round((med["ours"] - med["floor"]) / med["plain"], 3)
    checks["spmd launch: on the launch hosts, no new actor (launch/pool.py)"] = all(hosts)


def start_overhead(cluster: Cluster, first_of_cluster: bool, repeats: int = 5) -> None:
    """Submit -> first line through raystack and through Ray's own SDK (bench/queue_gap.py's
    floor: the cluster's token, as raystack's), alternating; `first_of_cluster`: no job ran
    before, so the first of ours is what `up` left the cluster's first job to pay."""
    import queue_gap

    ours, theirs = [], []
    for _ in range(repeats):
        t0 = time.time()
        job = cluster.submit(["python", "-c", FIRST], sets=["name=first"])
        job.wait(timeout=300)
        ours.append(queue_gap.first_line(job) - t0)
        theirs += queue_gap.floor(cluster, 1)
    figures["start_raystack_s"] = [round(x, 3) for x in ours]
    figures["start_ray_sdk_s"] = [round(x, 3) for x in theirs]
    figures["start_ratio"] = round(statistics.median(ours) / statistics.median(theirs), 3)
    checks["start overhead <= 1.1x Ray's SDK"] = figures["start_ratio"] <= 1.1
    if first_of_cluster:
        figures["start_first_job_ratio"] = round(ours[0] / statistics.median(theirs), 3)
        figures["start_later_jobs_ratio"] = round(statistics.median(ours[1:]) / statistics.median(theirs), 3)
        checks["the cluster's first job <= 1.1x the warm SDK median"] = (
            figures["start_first_job_ratio"] <= 1.1
        )
    queue_gaps(cluster)


def queue_gaps(cluster: Cluster, jobs: int = 8) -> None:
    """bench/queue_gap.py's figures: 8 gaps part by part, and a pip environment's (made while the
    job before it runs) against its setup alone."""
    import queue_gap

    packages = int(os.environ.get("GPU_SUITE_PIP_PACKAGES", "20"))  # (a setup of over 10 s alone)

    gaps = queue_gap.trivial(cluster, jobs)
    med = {k: round(statistics.median(g[k] for g in gaps), 3) for k in gaps[0]}
    figures["queue_gap_parts"], figures["queue_gap_median"] = gaps, med
    figures["queue_gap_s"] = [g["end_to_submitted"] for g in gaps]
    checks["queue gap end -> next submitted < 0.5 s (median of 8)"] = med["end_to_submitted"] < 0.5
    folder = Path(os.environ["RAYSTACK_HOME"]) / "wheels"
    stamp = f"rsg{os.getpid()}"
    alone = queue_gap.pip_alone(cluster, folder, f"{stamp}a", packages)
    floor = statistics.median(queue_gap.floor(cluster, 3))
    pip = queue_gap.pip_gap(cluster, folder, f"{stamp}p", packages)
    figures["pip_setup_alone_s"] = round(alone - floor, 2)
    figures["pip_gap"] = pip
    extra = pip["gap"]["end_to_first_line"] - med["end_to_first_line"]
    figures["pip_gap_extra_over_trivial_s"] = round(extra, 3)
    checks["pip job's gap < 1 s beyond a trivial job's (its setup alone > 10 s)"] = (
        extra < 1.0 and alone - floor > 10
    )


def zero3_memory(cluster: Cluster, ngpu: int) -> None:
    b = ZERO3_BENCH
    _, log = run(
        cluster,
        DEBUG / "zero3.yaml",
        [
            f"entrypoint=python zero3.py --bf16 --no-reference --learners {ngpu} --strategy PACK "
            f"--hidden {b['hidden']} --layers {b['layers']} --steps {b['steps']} "
            f"--global-batch {b['global_batch']}",
            "name=zero3-bench",
        ],
    )
    z3 = marker(log, "ZERO3")
    params = z3["params_total"]
    predicted = learner_memory(
        Model("mlp", params, b["hidden"], b["layers"] + 2, vocab=1, heads=1, kv_heads=1),
        learners=ngpu,
        seq_len=1,
        micro_batch=b["global_batch"] // ngpu,
    )
    peak = max(z3["peak_gb"])
    figures["zero3"] = {
        "params": params,
        "learners": ngpu,
        "step_s": z3["step_s"],
        "peak_allocated_gb": z3["peak_gb"],
        "peak_reserved_gb": z3.get("reserved_gb"),
        "predicted_gb": round(predicted.total, 3),
        "predicted_terms_gb": {
            k: round(v, 3) for k, v in predicted.to_dict().items() if isinstance(v, float)
        },
        "measured_vs_predicted": round(peak / predicted.total, 3),
    }
    checks["zero3 bf16 bench: loss finite"] = z3["loss_finite"]


def grpo(cluster: Cluster, where: str, ngpu: int, steps: int = 10) -> None:
    """grpo_tiny with vLLM engines where vLLM is installed (torch rollouts else): on one GPU the
    planner's --single_gpu_mode (learner and engine share it, weights over gloo), on more the
    learners on half the GPUs and the engines on the rest (weights over NCCL)."""
    layout = ["plan.learners=1", "plan.engines=1"] if ngpu == 1 else [
        f"plan.learners={ngpu // 2}", f"plan.per_bundle={ngpu // 2}", f"plan.engines={ngpu - ngpu // 2}"
    ]  # fmt: skip
    _, log = run(
        cluster,
        GRPO,
        [
            f"entrypoint=python grpo_tiny.py {{plan.flags}} --steps {steps} --learner-cpus-per-gpu 1",
            *layout,
            f"name=grpo-{where}",
            f"outputs.checkpoints=/tmp/grpo-tiny-{where}-{os.getpid()}",
        ],
        timeout=1200,
    )
    summary = marker(log, "GRPO")
    figures[f"grpo_tiny_{where}"] = {
        k: summary.get(k)
        for k in (
            "rollouts", "device", "sync_backend", "single_gpu_mode", "median_s", "rewards", "engine_start_s",
            "learner_gpus", "engine_gpus",
        )
    }  # fmt: skip
    rewards = summary.get("rewards") or [0]
    checks["grpo_tiny on GPUs: weights pushed into the engines every step"] = summary[
        "weights_synced_every_step"
    ]
    checks["grpo_tiny on GPUs: the reward rises"] = max(rewards[len(rewards) // 2 :]) > rewards[0]
    if ngpu == 1:
        checks["grpo_tiny on one GPU: learner and engine share it, weights over gloo"] = (
            summary.get("single_gpu_mode") is True and summary.get("sync_backend") == "gloo"
        )
    else:
        checks["grpo_tiny on GPUs: NCCL weight sync"] = summary.get("sync_backend") == "nccl"
    if summary.get("rollouts") != "vllm":
        skipped["grpo_tiny with vLLM"] = "vLLM is not installed here (tests/gpu/stage installs it)"


# ---------------------------------------------------------------------------- the run
def monitor(cluster: Cluster, ngpu: int) -> None:
    """top and report on real GPUs: a job with every GPU busy shows in both."""
    from raystack.client import report
    from raystack.client.top import snapshot

    job = cluster.submit(DEBUG / "burn.yaml", sets=[f"entrypoint=python burn.py --seconds 40 --gpus {ngpu}"])
    deadline, seen = time.monotonic() + 90, None
    while time.monotonic() < deadline and not job.record().state.is_terminal():
        view = snapshot(cluster.name)
        utils = [g["util"] or 0 for n in view["nodes"] for g in n["gpus"]]
        if len(utils) == ngpu and min(utils) >= 50:
            seen = view
            break
        time.sleep(1)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    record = job.wait(timeout=180)
    checks["burn --gpus SUCCEEDED"] = record.state is JobState.SUCCEEDED
    gpus = [g for n in (seen or {}).get("nodes", []) for g in n["gpus"]]
    figures["top_gpus_under_burn"] = [{"util": g["util"], "mem_mib": g["mem_used_mib"]} for g in gpus]
    figures["nvidia_smi_then"] = [line for line in smi if line.strip()]
    checks["top: every GPU >= 50% busy under the burn job"] = seen is not None
    checks["top: GPU memory in use on every GPU"] = len(gpus) == ngpu and all(
        (g["mem_used_mib"] or 0) > 100 for g in gpus
    )
    figures_ = report.summarize(cluster.record(), cluster.jobs(), job.id)
    figures["report_burn"] = {k: figures_[k] for k in ("job_s", "gpu_util_busy", "gpu_util_idle", "per_node")}
    checks["report: the burn job's mean GPU utilisation >= 50%"] = (figures_["gpu_util_busy"] or 0) >= 50
    checks["report: usage samples hold every GPU"] = all(
        n["gpu_mem_peak_mib"] and n["gpu_mem_peak_mib"] > 100 for n in figures_["per_node"]
    )
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "bench" / "results"
    try:
        report.plot(figures_, cluster.record(), out / "gpu_report_burn.png")
    except ImportError:
        say("no matplotlib here: no PNG")


def canary(cluster: Cluster, ngpu: int) -> None:
    """The interconnect canary ran before READY: its all-reduce over every GPU, and NCCL's
    transport between them (one node here: NVLink/P2P or SHM, nothing between nodes)."""
    found = cluster.record().canary or {}
    figures["canary"] = found
    say(f"canary: {found}")
    checks["canary at READY: every GPU, right sum"] = found.get("state") == "ok" and found.get("gpus") == ngpu
    if ngpu > 1:
        checks["canary: a transport within the node, bus bandwidth measured"] = bool(
            found.get("within") and found.get("busbw_gbps")
        )


def faults_part(cluster: Cluster, ngpu: int) -> None:
    found, ok, skip = run_faults(cluster, ngpu, say)
    figures["faults"] = found
    checks.update(ok)
    skipped.update(skip)


def frameworks_part(cluster: Cluster, ngpu: int) -> None:
    found, ok, skip = run_frameworks(cluster, ngpu, say)
    figures["frameworks"] = found
    checks.update(ok)
    skipped.update(skip)


def up(name: str, *args: str) -> tuple[Cluster, float]:
    t0 = time.monotonic()
    cli("up", "--local", "--name", name, *args)
    took = time.monotonic() - t0
    say(f"cluster {name} READY in {took:.1f}s")
    return Cluster(name), took


def kept_cluster(name: str) -> Cluster | None:
    """A READY cluster a run with GPU_SUITE_KEEP=1 left (None if there is none)."""
    try:
        cluster = Cluster(name)
        return cluster if cluster.record().state.value == "READY" else None
    except Exception:
        return None


def down(cluster: Cluster) -> None:
    job_id = str(cluster.record().allocation_id)
    cli("down", cluster.name)
    deadline = time.monotonic() + 30
    while local.pids(job_id, everything=True) and time.monotonic() < deadline:
        time.sleep(0.5)
    checks[f"{cluster.name}: no process left after down"] = not local.pids(job_id, everything=True)


def context(ngpu: int) -> dict[str, Any]:
    import ray
    import torch

    names = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    )
    versions = {"python": platform.python_version(), "ray": ray.__version__, "torch": torch.__version__}
    try:
        import deepspeed

        versions["deepspeed"] = deepspeed.__version__
    except ImportError:
        pass
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": {
            "gpus": ngpu,
            "names": sorted(set(names.stdout.split("\n")) - {""}),
            "cpus": os.cpu_count(),
        },
        "versions": versions,
    }


def main() -> int:
    ngpu = len(local.gpu_ids())
    if not ngpu:
        raise SystemExit("no GPU here (nvidia-smi -L lists none)")
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    if only and (unknown := set(only) - set(PARTS)):
        raise SystemExit(f"--only {','.join(sorted(unknown))}: not a part; the parts: {','.join(PARTS)}")
    os.environ.setdefault("RAYSTACK_SAMPLE_EVERY", "2")  # usage samples for the monitor figures
    # GPU_SUITE_KEEP=1: the cluster outlives this run (its node program runs in a session of its
    # own, which the device tool leaves running on a warm machine), and the next run with it set
    # takes it up again: parts longer than one 10-minute device run go over several.
    keep = os.environ.get("GPU_SUITE_KEEP") == "1"
    if keep and (kept := kept_cluster("gpu")) is not None:
        gpu, figures["ready_s"] = kept, None
    else:
        gpu, figures["ready_s"] = up("gpu")
    canary(gpu, ngpu)
    try:
        for part in only or PARTS:
            if part == "jobs":
                jobs(gpu, ngpu)
            elif part == "torchrun":
                guarded("plain torchrun", plain_torchrun, ngpu)
                guarded("spmd launch", spmd_launch, gpu, ngpu)
            elif part == "start":
                first = (only or PARTS)[0] == "start" and figures["ready_s"] is not None
                guarded("start overhead", start_overhead, gpu, first)
            elif part == "zero3":
                guarded("zero3 memory", zero3_memory, gpu, ngpu)
            elif part == "grpo":
                guarded("grpo_tiny gpu", grpo, gpu, "gpu", ngpu)
            elif part == "faults":
                guarded("faults", faults_part, gpu, ngpu)
            elif part == "frameworks":
                guarded("frameworks", frameworks_part, gpu, ngpu)
            else:
                guarded("monitor", monitor, gpu, ngpu)
    finally:
        if not keep:
            down(gpu)
    held = gpu_processes() if not keep else []
    checks["no process holds a GPU after down"] = not held
    natives = os.environ.get("FRAMEWORKS_NATIVE") != "no"
    if "frameworks" in (only or PARTS) and figures.get("frameworks") and natives:
        checks.update(guarded("frameworks native", native, figures["frameworks"], ngpu, say) or {})
    result = {
        "benchmark": "gpu_suite",
        **context(ngpu),
        "figures": figures,
        "checks": checks,
        "skipped": skipped,
    }
    text = "\n".join(
        [f"{'check':<60} ok"] + [f"{k:<60} {'yes' if v else 'NO'}" for k, v in checks.items()]
        + [f"{k}: {json.dumps(v)[:300]}" for k, v in figures.items()]
        + [f"skipped {k}: {v}" for k, v in skipped.items()]
    )  # fmt: skip
    print(text)
    print(json.dumps(result))
    # (one GPU's full run keeps the name it always had; more GPUs, parts and a FAULTS subset are
    # named, so that a run of one fault never overwrites the results of all of them)
    subset = os.environ.get("FAULTS", "").replace(",", "-")
    parts = [
        f"faults-{subset}" if p == "faults" and subset else p
        for p in only or (["all", "faults"] if subset else [])
    ]
    stem = "gpu_suite" + (f"_{ngpu}gpu" if ngpu > 1 else "") + (f"_{'-'.join(parts)}" if parts else "")
    for folder in (REPO / "bench" / "results", Path(os.environ["OUT"]) if os.environ.get("OUT") else None):
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
            (folder / f"{stem}.txt").write_text(text + "\n")
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
