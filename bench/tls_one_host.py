"""Benchmark: Ray's object transfer between two Ray nodes of one host, plain and with TLS.

bench/tls_cost.py prices `tls: true` on the testbed, where both "nodes" of a transfer share the
machine's 2 cores: the sender's encryption and the receiver's decryption take the cores of the
copy. This one asks what TLS costs where each side has cores of its own: two Ray nodes (a head and
a worker, `ray.cluster_utils`, `--cpus` each) on this host, with the certificates `tls: true`
gives a node (raystack.store.tls: the cluster's CA, a node certificate, Ray's RAY_USE_TLS
variables, and raystart.TLS_CONNECTIONS object-manager connections per peer) or without, as
raystack starts a plain node (Ray's defaults; RAY_object_manager_* of the shell go to both arms),
alternating (--rounds each, which one goes first too), each arm in a fresh process and cluster.
Each arm moves --mib MiB from node A's object store to a task on node B, 256 MiB at a time, 3
times, less the same reads on A (jobs/debug/transfer.py). Reported: the medians, TLS / plain
(issue 43's target: >= 0.8x), and what one core here takes to encrypt and decrypt a GiB.

    python bench/tls_one_host.py [--rounds 3] [--mib 1024] [--cpus 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "jobs" / "debug"))

CHUNK_MIB, REPEATS = 256, 3


def arm(mib: int, cpus: int) -> dict:
    """In a process whose environment holds (or not) Ray's TLS variables: two nodes, the transfer."""
    import ray
    from ray.cluster_utils import Cluster
    from transfer import timed_reads

    store = (CHUNK_MIB * 4 + 256) << 20  # (4 objects of 256 MiB in flight at most)
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "object_store_memory": store})
    cluster.add_node(num_cpus=cpus, object_store_memory=store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    start = time.time() - t0
    try:
        head = ray.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
        timed_reads(head, other, CHUNK_MIB, CHUNK_MIB)  # (warm-up: a worker on each node)
        cpu0 = core_seconds()
        remote = [timed_reads(head, other, mib, CHUNK_MIB) for _ in range(REPEATS)]
        cpu1 = core_seconds()
        local = [timed_reads(head, head, mib, CHUNK_MIB) for _ in range(REPEATS)]
        cpu2 = core_seconds()
    finally:
        ray.shutdown()
        cluster.shutdown()
    moved = statistics.median(remote) - statistics.median(local)
    return {
        # (Ray's object-manager settings of this arm: raystack's for a TLS node, the shell's)
        "ray_settings": {k: v for k, v in os.environ.items() if k.startswith("RAY_object_manager_")},
        "start_s": round(start, 2),
        "remote_s": [round(x, 3) for x in remote],
        "local_s": [round(x, 3) for x in local],
        "gib_per_s": round(mib / 1024 / moved, 3) if moved > 0 else None,
        # (what this host's cores spent per GiB moved, every Ray process of both nodes, less the
        # same reads on one node)
        "core_s_per_gib": round(((cpu1 - cpu0) - (cpu2 - cpu1)) / (REPEATS * mib / 1024), 3),
    }


def core_seconds() -> float:
    """User and system CPU seconds so far of this process and every process under it (the
    cluster's: cluster_utils starts them)."""
    import psutil

    total = 0.0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def tls_env(home: Path) -> dict[str, str]:
    """Ray's TLS variables with a CA and a node certificate made as `raystack up` makes them."""
    import socket

    os.environ["RAYSTACK_HOME"] = str(home)
    from raystack.store import paths, tls

    paths.cluster("bench").tls.parent.mkdir(parents=True)
    tls.create_ca("bench")
    into = home / "node"
    into.mkdir(mode=0o700)
    ident = tls.issue_node_cert("bench", "127.0.0.1", socket.gethostname(), into)
    return tls.ray_env(ident, tls.ca_cert("bench"))


def run_arm(use_tls: bool, args: argparse.Namespace, home: Path) -> dict:
    from raystack.allocation.node.raystart import TLS_CONNECTIONS
    from raystack.store.tls import RAY_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in RAY_VARIABLES}
    if use_tls:  # (what a `tls: true` node gets from raystack: its certificate, more connections)
        env.update(tls_env(home))
        env.setdefault("RAY_object_manager_client_connection_num", TLS_CONNECTIONS)
    command = [sys.executable, __file__, "--arm", "--mib", str(args.mib), "--cpus", str(args.cpus)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("ARM ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"tls={use_tls} arm failed (rc {done.returncode}): {done.stderr[-3000:]}")
    return json.loads(line.removeprefix("ARM "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--cpus", type=int, default=4, help="CPUs each Ray node declares")
    parser.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print("ARM " + json.dumps(arm(args.mib, args.cpus)), flush=True)
        return
    from _report import publish
    from tls_cost import crypto_seconds, order, pairs

    crypto = crypto_seconds()
    runs: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-tls1-") as tmp:
        for i in range(args.rounds):
            for use_tls in order(i):
                runs[use_tls].append(run_arm(use_tls, args, Path(tmp) / f"{int(use_tls)}-{i}"))
                print(f"round {i} tls={use_tls}: {runs[use_tls][-1]}", flush=True)

    def rate(use_tls: bool) -> float:
        return statistics.median(r["gib_per_s"] for r in runs[use_tls] if r["gib_per_s"])

    def start(use_tls: bool) -> float:
        return statistics.median(r["start_s"] for r in runs[use_tls])

    def cores(use_tls: bool) -> float:
        return statistics.median(r["core_s_per_gib"] for r in runs[use_tls])

    extra = 1 / rate(True) - 1 / rate(False)
    ratio = rate(True) / rate(False)
    paired = pairs([r["gib_per_s"] for r in runs[False]], [r["gib_per_s"] for r in runs[True]])
    lines = [
        f"{'':>30} {'plain':>8} {'tls':>8} {'tls/plain':>10}",
        f"{'two nodes up, s':>30} {start(False):>8.2f} {start(True):>8.2f} {start(True) / start(False):>10.2f}",
        f"{f'{args.mib} MiB node -> node, GiB/s':>30} {rate(False):>8.3f} {rate(True):>8.3f} {ratio:>10.2f}",
        f"{'core-seconds per GiB moved':>30} {cores(False):>8.2f} {cores(True):>8.2f} {cores(True) / cores(False):>10.2f}",
        f"2 Ray nodes on one host of {os.cpu_count()} cores, {args.cpus} CPUs each, {args.rounds} rounds "
        f"(plain first in the even ones, TLS in the odd); medians; TLS / plain round by round {paired}. TLS adds {extra:.2f} s and {cores(True) - cores(False):.2f} core-seconds per "
        f"GiB; of them the cipher (one core encrypting and decrypting 1 GiB with AES-128-GCM in TLS records) "
        f"{crypto:.2f} s; target >= 0.8x: {'met' if ratio >= 0.8 else 'NOT met'}",
    ]
    publish(
        os.environ.get("RAYSTACK_BENCH_NAME", "tls_one_host"),
        "\n".join(lines),
        {
            "rounds": args.rounds,
            "mib": args.mib,
            "cpus_per_node": args.cpus,
            "plain": runs[False],
            "tls": runs[True],
            "ratio": round(ratio, 3),
            "pairs": paired,
            "crypto_s_per_gib": round(crypto, 3),
            "tls_extra_s_per_gib": round(extra, 3),
        },
    )


if __name__ == "__main__":
    main()
