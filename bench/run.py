"""Every benchmark of issue 43 (and the cluster's start) from one command, each with the baseline
of its own run, one after another on the testbed (they must not share the machine).

    python bench/run.py [--size quick|full] [--only queue_gap,spmd_launch]

  cluster_ready   up -> READY against the floor (Ray started by hand), with and without raystack
  queue_overhead  per-job time through the queue against Ray's SDK; fresh allocations per job
  queue_gap       the gap between two queued jobs part by part; a pip environment prepared or not
  spmd_launch     a `kind: spmd` torchrun job against srun + torchrun in the same allocation
  start_ab        later jobs through raystack against Ray's SDK on local clusters, interleaved,
                  and the SDK sending what the runner sends; each cluster's first job (raystack's
                  on every other one, the SDK's on the rest) against that cluster's warm SDK
  job_count       a sweep of N jobs back to back: the last tenth's start against the first's
  tls_cost        a TLS cluster against a plain one: start, queue, 1 GiB node -> node
  tls_one_host    Ray's object transfer with and without TLS between two Ray nodes of this host
                  (on a machine with cores to spare it shows what the testbed's 2 shared cores hide)
  autoscale       up -N 1 --max-nodes 4 against fixed 1- and 4-node clusters: makespan, node-hours
  chain_grow      a grown node across a chain's hand-over: its rejoin, and a job on both nodes

Each writes bench/results/<name>.{txt,json} (date, machine, versions); this one adds
bench/results/bench_run.{txt,json}: what ran, how long, its headline figure and whether it
passed. `quick` (about 15 min on the 2-core testbed) uses fewer repeats; `full` about 60 min.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import publish  # noqa: E402

# name -> (quick arguments, full arguments, the headline: (label, path in its JSON))
BENCHES: dict[str, tuple[list[str], list[str], tuple[str, list[Any]]]] = {
    "cluster_ready": (
        ["--nodes", "4", "--repeat", "1", "--kinds", "floor", "raystack", "--actors", "0"],
        ["--nodes", "1", "2", "4", "--repeat", "2", "--kinds", "floor", "raystack", "--actors", "0"],
        ("READY / floor, largest N", ["rows", -1, "raystack_over_floor"]),
    ),
    "queue_overhead": (
        ["--jobs", "6", "--fresh", "1"],
        ["--jobs", "10", "--fresh", "3"],
        ("queue / SDK per job", ["results", "queue_over_floor"]),
    ),
    "queue_gap": (
        ["--jobs", "8", "--pip", "1"],
        ["--jobs", "8", "--pip", "2"],
        ("end -> next submitted, s (median)", ["gap_median", "end_to_submitted"]),
    ),
    "spmd_launch": (["--repeats", "3", "--no-actors"], ["--repeats", "3"], ("raystack / srun", ["ratio"])),
    "start_ab": (
        ["--rounds", "3", "--clusters", "2"],
        ["--rounds", "4", "--clusters", "4"],
        ("raystack / SDK, later jobs", ["ratio", "raystack"]),
    ),
    "job_count": (
        ["--jobs", "40"],
        ["--jobs", "100"],
        ("a sweep's last tenth / first, each over the SDK then", ["ratio_last_to_first"]),
    ),
    "tls_cost": (
        ["--rounds", "2", "--jobs", "4", "--transfers", "2"],
        ["--rounds", "4", "--jobs", "6", "--transfers", "3"],
        ("TLS / plain, 1 GiB transfer", ["ratios", "1 GiB node -> node, GiB/s"]),
    ),
    "tls_one_host": (
        ["--rounds", "2", "--cpus", "4"],
        ["--rounds", "4", "--cpus", "4"],
        ("TLS / plain, 1 GiB between 2 Ray nodes of one host", ["ratio"]),
    ),
    "autoscale": (
        ["--jobs", "3", "--seconds", "30", "--idle", "20"],
        ["--jobs", "3", "--seconds", "60", "--idle", "30"],
        ("auto node-hours / fixed 4 nodes", ["auto_node_hours_vs_fixed4"]),
    ),
    "chain_grow": ([], [], ("second head READY -> grown node in its Ray, s", ["rejoin_s"])),
}


def headline(name: str, path: list[Any]) -> Any:
    """The figure at `path` in bench/results/<name>.json (None where it is not there)."""
    try:
        value: Any = json.loads((HERE / "results" / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    for key in path:
        if isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
            value = value[key]
        else:
            value = value.get(key) if isinstance(value, dict) else None
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["quick", "full"], default="quick")
    parser.add_argument("--only", default="", help="comma-separated names (default: every one)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(BENCHES)
    if unknown := set(names) - set(BENCHES):
        raise SystemExit(
            f"--only: {', '.join(sorted(unknown))} not a benchmark; the benchmarks: {', '.join(BENCHES)}"
        )
    rows = []
    for name in names:
        quick, full, (label, path) = BENCHES[name]
        argv = [sys.executable, str(HERE / f"{name}.py"), *(quick if args.size == "quick" else full)]
        print(f"[bench] {' '.join(argv[1:])}", flush=True)
        t0 = time.monotonic()
        code = subprocess.run(argv).returncode
        rows.append(
            {
                "benchmark": name,
                "seconds": round(time.monotonic() - t0),
                "exit": code,
                "headline": label,
                "value": headline(name, path) if code == 0 else None,
            }
        )
    table = "\n".join(
        [f"{'benchmark':16} {'s':>6} {'exit':>4}  headline"]
        + [
            f"{r['benchmark']:16} {r['seconds']:>6} {r['exit']:>4}  {r['headline']}: {r['value']}"
            for r in rows
        ]
    )
    publish("bench_run", table, {"size": args.size, "runs": rows})
    sys.exit(1 if any(r["exit"] for r in rows) else 0)


if __name__ == "__main__":
    main()
