"""Benchmark: time from the allocation becoming RUNNING to a usable Ray cluster, N = 1 ... 32.

Ways to start Ray in the same SLURM allocation shape, measured in the same run:
  floor     bare `ray start --head` and every worker started at once (one srun), no checks.
  raystack  `raystack up --profile testbed` (raystack.allocation.node): free ports, token auth,
            READY = all nodes + GPUs + CPUs registered and the Jobs API answering an authenticated
            request; workers join in waves (the profile's `join_window`: at most W registering at
            once) and a worker whose `ray start` fails while the head waits tries again.
  raystack-all  the same with `join_window: 0`: every worker at once (only where N - 1 > W).
  ray-docs  the pattern of Ray's SLURM documentation: head, `sleep 10`, then the workers one by
            one with `sleep 5` between them.
RUNNING is observed by polling squeue from the login node (every 50 ms); the floor and ray-docs
are "ready" when the State API on the head reports N alive nodes (polled every 100 ms). raystack
is ready when its record says READY (a stricter condition: it also checks GPUs, CPUs and Jobs).
A way that does not come up is a result: its row says FAILED with the reason (baselines get
60 s + 8 s per node). On each raystack cluster: `raystack status` (Cluster.status, median of 5)
and, with --actors K at N in --actors-at, the time from submitting jobs/debug/actors.py (K actors
at once, round robin over every node) to all of them alive.

    python bench/cluster_ready.py [--nodes 1 2 4 8 16 32] [--repeat 2] [--actors 300 --actors-at 4 16]

Prints a table and one JSON line; writes bench/results/cluster_ready.{json,txt}.
Needs root and the testbed with max(--nodes) nodes (started here if needed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import publish  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.adapters import slurm  # noqa: E402
from raystack.adapters.ray import Dashboard  # noqa: E402
from raystack.errors import RayApiError, RaystackError  # noqa: E402
from raystack.spec.profile import load_profile  # noqa: E402
from raystack.store import cluster as clusters  # noqa: E402
from raystack.store import paths  # noqa: E402

HOME = Path(os.environ.get("RAYSTACK_TESTBED_DIR", "/var/lib/raystack-testbed")) / "home"
TARGET = 1.0  # raystack READY within 1.0x of the floor wherever the floor comes up
WINDOW = load_profile("testbed").join_window
BASE = r"""#!/bin/bash
set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
export PATH={bindir}:$PATH
# Testbed nodes share /tmp: each Ray node needs its own temp dir (raystack uses rs-<job>-<host>).
# $(hostname) is expanded by the bash -c on each node, not here.
OPTS='--num-cpus=4 --num-gpus=4 --object-store-memory=268435456 --disable-usage-stats --block'
OPTS="$OPTS --temp-dir=/tmp/rb-$SLURM_JOB_ID-"'$(hostname)'
head_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
head_ip=$(getent hosts "$head_host" | awk '{{print $1}}')
srun --overlap --nodes=1 --ntasks=1 -w "$head_host" bash -c \
  "ray start --head --node-ip-address=$head_ip --port=6379 --dashboard-host=$head_ip --dashboard-port=8265 $OPTS" &
"""
FLOOR = (
    BASE
    + r"""
if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then
  # NOTE: srun inherits SLURM_NTASKS from the batch step: give the task count explicitly.
  srun --overlap --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks=$((SLURM_JOB_NUM_NODES - 1)) \
    --ntasks-per-node=1 --exclude="$head_host" bash -c \
    "ray start --address=$head_ip:6379 --node-ip-address=\$(getent hosts \$(hostname) | awk '{{print \$1}}') $OPTS" &
fi
wait
"""
)
RAY_DOCS = (
    BASE
    + r"""
sleep 10
for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n +2); do
  srun --overlap --nodes=1 --ntasks=1 -w "$node" bash -c \
    "ray start --address=$head_ip:6379 --node-ip-address=\$(getent hosts \$(hostname) | awk '{{print \$1}}') $OPTS" &
  sleep 5
done
wait
"""
)


class Failed(Exception):
    """This way of starting did not give a usable cluster: a result, with its reason."""


def wait_running(job: str) -> float:
    """Epoch time at which squeue first shows the job RUNNING (50 ms polling)."""
    while True:
        info = slurm.job_info(job)
        if info and info.state is slurm.AllocState.RUNNING:
            return time.time()
        if info and info.state.is_terminal():
            raise RuntimeError(f"job {job} ended before running: {info.state}")
        time.sleep(0.05)


def wait_alive(url: str, nodes: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    alive = 0
    while time.monotonic() < deadline:
        try:
            alive = len(Dashboard(url, token="").alive_nodes(timeout=2))
            if alive >= nodes:
                return time.time()
        except RayApiError:
            pass
        time.sleep(0.1)
    raise Failed(f"{alive}/{nodes} nodes alive after {timeout:.0f}s")


def why_failed(log: Path) -> str:
    """What the baseline's workers said: the distinct errors of its `ray start`s, counted."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = re.findall(
        r"(The current node timed out during startup|Failed to get node info[^\n]{0,60}|"
        r"Deadline Exceeded|Connection refused|Exception: [^\n]{0,80})",
        text,
    )
    counts: dict[str, int] = {}
    for f in found:
        counts[f] = counts.get(f, 0) + 1
    return "; ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:2])


def testbed_ip(host: str) -> str:
    hosts = (HOME.parent / "etc" / "hosts").read_text().split("\n")
    return next(line.split()[0] for line in hosts if line.split()[1:] == [host])


def end_job(job: str) -> None:
    slurm.scancel(job)
    while (info := slurm.job_info(job)) and not info.state.is_terminal():
        time.sleep(0.2)


def run_baseline(kind: str, nodes: int, workdir: Path) -> float:
    script = workdir / f"{kind}.sbatch"
    template = FLOOR if kind == "floor" else RAY_DOCS
    script.write_text(template.format(bindir=Path(sys.executable).parent))
    job = slurm.sbatch(
        [
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            "--cpus-per-task=4",
            "--gpus-per-node=4",
            "--partition=testbed",
            f"--output={workdir}/{kind}-%j.log",
        ],
        str(script),
    )
    try:
        running = wait_running(job)
        info = slurm.job_info(job)
        assert info is not None
        head = slurm.hostnames(info.nodes)[0]
        ip = testbed_ip(head)
        try:
            return wait_alive(f"http://{ip}:8265", nodes, timeout=60 + 8 * nodes) - running
        except Failed as exc:
            reason = why_failed(workdir / f"{kind}-{job}.log")
            raise Failed(f"{exc}{f' ({reason})' if reason else ''}") from None
    finally:
        end_job(job)


def run_raystack(nodes: int, name: str, window: int | None, actors: int, extra: dict) -> float:
    profile = load_profile("testbed")
    if window is not None:
        profile = profile.model_copy(update={"join_window": window})
    cluster = Cluster.up(nodes, profile=profile, name=name, wait=False)
    job = str(cluster.record().allocation_id)
    try:
        running = wait_running(job)
        try:
            cluster.wait_ready(timeout=600)
        except RaystackError as exc:
            raise Failed(str(exc).splitlines()[0][:200]) from None
        ready = next(h["time"] for h in clusters.read(name).history if h["state"] == "READY")
        logs = paths.cluster(name).logs
        extra["retries"] = sum(
            p.read_text(errors="replace").count("trying again") for p in logs.glob("node-*.log")
        )
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            cluster.status()
            times.append(time.perf_counter() - t0)
        extra["status_s"] = statistics.median(times)
        if actors:
            submitted = time.time()
            result = cluster.submit(
                str(REPO / "jobs/debug/actors.yaml"), sets=[f"entrypoint=python actors.py --actors {actors}"]
            )
            record = result.wait(timeout=1800)
            line = next((x for x in result.logs().splitlines() if x.startswith('{"actors"')), None)
            if line is None:
                extra["actors"] = {"failed": f"job {record.state.value}: {record.message}"[:200]}
            else:
                out = json.loads(line)
                extra["actors"] = {
                    "count": out["actors"],
                    "alive": out["alive"],
                    "errors": out["error_count"],
                    "submit_to_all_alive_s": round(out["all_alive_at"] - submitted, 2),
                    "first_error": (out["errors"] or [None])[0],
                }
        return ready - running
    finally:
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", default=["floor", "raystack", "raystack-all", "ray-docs"])
    parser.add_argument("--actors", type=int, default=300, help="actors of the burst job (0: none)")
    parser.add_argument("--actors-at", type=int, nargs="*", default=[4, 16])
    args = parser.parse_args()
    subprocess.run(
        [str(REPO / "slurm/testbed/up"), "--nodes", str(max(args.nodes))],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    HOME.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=HOME))
    os.environ["RAYSTACK_HOME"] = str(workdir / "rs")
    samples: dict[tuple[int, str], list[float | str]] = {}
    extras: dict[tuple[int, str], list[dict]] = {}
    for rep in range(args.repeat):
        for n in args.nodes:
            for kind in args.kinds:
                if kind == "raystack-all" and n - 1 <= WINDOW:
                    continue  # (the same start as `raystack`)
                extra: dict = {}
                try:
                    if kind.startswith("raystack"):
                        every = kind == "raystack-all"
                        actors = args.actors if not every and rep == 0 and n in args.actors_at else 0
                        t: float | str = run_raystack(
                            n, f"bench-{n}-{rep}-{kind}", 0 if every else None, actors, extra
                        )
                    else:
                        t = run_baseline(kind, n, workdir)
                except Failed as exc:
                    t = f"FAILED: {exc}"
                samples.setdefault((n, kind), []).append(t)
                extras.setdefault((n, kind), []).append(extra)
                shown = f"{t:6.2f}s" if isinstance(t, float) else t
                print(f"  rep {rep} N={n} {kind:14s} {shown} {extra or ''}", file=sys.stderr, flush=True)
    report(args, samples, extras)


def _median(values: list[float | str]) -> float | str:
    """The median of the runs that came up; a failure where most runs failed."""
    ok = [v for v in values if isinstance(v, float)]
    if len(ok) * 2 >= len(values) and ok:
        return statistics.median(ok)
    return next(v for v in values if isinstance(v, str))


def report(args: argparse.Namespace, samples: dict, extras: dict) -> None:
    med = {k: _median(v) for k, v in samples.items()}
    kinds = [k for k in args.kinds if any((n, k) in med for n in args.nodes)]
    rows, failures = [], []
    for n in args.nodes:
        row: dict = {"nodes": n}
        for k in kinds:
            if (n, k) in med:
                row[f"{k}_s"] = round(m, 2) if isinstance(m := med[(n, k)], float) else m
        floor, ours = med.get((n, "floor")), med.get((n, "raystack"))
        if isinstance(floor, float) and isinstance(ours, float):
            row["raystack_over_floor"] = round(ours / floor, 2)
            row["within_target"] = ours / floor <= TARGET
        else:
            row["within_target"] = isinstance(ours, float)  # READY where the floor failed
        found = [e for e in extras.get((n, "raystack"), []) if e]
        if found:
            row["raystack_retries"] = [e.get("retries") for e in found]
            row["status_s"] = round(statistics.median(e["status_s"] for e in found if "status_s" in e), 3)
            row["actors"] = next((e["actors"] for e in found if "actors" in e), None)
        rows.append(row)
    width = {k: max(10, len(k) + 2) for k in kinds}
    lines = [
        f"{'N':>3} "
        + " ".join(f"{k + ' s':>{width[k]}}" for k in kinds)
        + f" {'raystack/floor':>14} {'status s':>8}"
    ]
    for r in rows:
        cells = []
        for k in kinds:
            v = r.get(f"{k}_s", "-")
            if isinstance(v, str) and v.startswith("FAILED"):
                failures.append(f"N={r['nodes']} {k}: {v}")
                v = "FAILED"
            cells.append(f"{v:>{width[k]}.2f}" if isinstance(v, float) else f"{v:>{width[k]}}")
        ratio = r.get("raystack_over_floor")
        lines.append(
            f"{r['nodes']:>3} " + " ".join(cells) + f" {ratio if ratio is not None else '-':>14}"
            f" {r.get('status_s', '-'):>8}{'' if r['within_target'] else ' !'}"
        )
    lines += [f"  {f}" for f in failures]
    for r in rows:
        if r.get("actors"):
            lines.append(f"  N={r['nodes']}: {json.dumps(r['actors'])}")
    result = {
        "target": f"raystack READY <= {TARGET}x floor where the floor comes up, READY where it does not",
        "join_window": WINDOW,
        "samples": {
            f"{n}/{k}": [round(x, 2) if isinstance(x, float) else x for x in v]
            for (n, k), v in samples.items()
        },
        "rows": rows,
    }
    publish("cluster_ready", "\n".join(lines), result)


if __name__ == "__main__":
    main()
