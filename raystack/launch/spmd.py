"""SPMD jobs (torchrun, the DeepSpeed launcher, accelerate) on the persistent cluster.

`python -m raystack.launch.spmd --launcher torchrun [--nodes N] [--procs-per-node P] -- CMD...`
is the driver of a `kind: spmd` job. It holds one bundle per node (STRICT_SPREAD: that node's
GPUs and CPUs) and runs each node's launcher (launch/node.py) with the rendezvous (node 0's
address and a free port there) and the node's GPUs (CUDA_VISIBLE_DEVICES): on the node's launch
host, a Ray worker the cluster keeps running (launch/pool.py), where the job fits; else in a new
launcher actor in the bundle, with the GPUs Ray assigned it. No hostfile to write and no ssh:
this replaces both. Where the queue runner had the head's launch host start them as it submitted
the job (launch/ahead.py), the driver adopts those instead and starts nothing.

Every line a launcher prints reaches the job's log prefixed with its node rank, like `srun
--label`, and every line of a rank with its rank too (`[node 1 rank 3] ...`): each rank writes
to files of its own (the launcher's option for it), read back as whole lines, so two ranks of a
node never glue their lines together. When one launcher exits non-zero the others are stopped at
once and the job fails naming the node, the rank and the exit code, with that node's last lines.
SIGTERM (`raystack stop`, a timeout, the walltime warning) stops every node's processes; a
launcher whose actor dies is killed by a watchdog process beside it, and one on a launch host
whose driver stopped asking (killed) within the host's lease, so nothing is left holding a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from raystack.launch import SECRET_NAMES_ENV, ahead, pool
from raystack.launch.launchers import cause, exit_words, failure, noise
from raystack.launch.node import NodeLauncherImpl
from raystack.launch.start import layout, parse, start_all
from raystack.waiting import REAL, Backoff, at_most, until

POLL = 0.2  # seconds between reads of the launchers' output while they print
QUIET = 1.0  # ... and at most this while they do not (each read costs the ranks' cores something)
TAIL = 20  # lines of a failed node shown in the job's failure
FIRST_WINDOW = 3.0  # seconds to see which other nodes fail after the first (whose error came first)


def main(args: list[str] | None = None) -> int:
    import ray

    ns = parse(sys.argv[1:] if args is None else args)
    began = time.time()
    ray.init()
    stopping = threading.Event()  # SIGTERM: `raystack stop`, a timeout, the walltime warning
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())  # NOTE: after ray.init (it sets one)
    t0 = time.time()
    sid = ahead.submission_id()
    taken = ahead.adopt(sid) or own(ns)  # (adopted: started as the job was submitted, launch/ahead.py)
    if isinstance(taken, str):
        print(f"raystack spmd: {taken}")
        return 2
    actors, places, how, commands, (nodes, procs, _, _) = taken
    placed = time.time()
    hosts = tuple(p["host"] for p in places)
    for line in commands:
        print(line, flush=True)
    print(
        f"raystack spmd: {ns.launcher} on {nodes} nodes x {procs} processes ({', '.join(hosts)}), "
        f"rendezvous {places[0]['ip']}:{places[0]['port']}, GPUs {[p['gpus'] for p in places]}, {how}; "
        f"connected in {t0 - began:.2f}s, nodes placed and launchers started {placed - t0:.2f}s after",
        flush=True,
    )
    try:
        return follow(actors, hosts, ns, t0, stopping, began)
    finally:
        if not ahead.release(sid):  # (adopted: the host that started them closes them)
            with contextlib.suppress(Exception):
                ray.get([a.close() for a in actors if isinstance(a, pool.Pooled)], timeout=30)


def own(ns: argparse.Namespace) -> tuple[list, list[dict], str, list[str], tuple] | str:
    """The driver places the job and starts every node's launcher itself (or why it cannot)."""
    import ray
    from ray.util.placement_group import placement_group

    fits = layout(ns, ray.nodes())
    if isinstance(fits, str):
        return fits
    nodes, procs, gpus, bundle = fits
    pg = placement_group([bundle] * nodes, strategy="STRICT_SPREAD")
    actors, places, env, how = launchers(pg, nodes, procs, bundle["CPU"], gpus)
    return actors, places, how, start_all(actors, places, ns, procs, bool(gpus), env), fits


def launchers(
    pg: Any, nodes: int, procs: int, cpus: int, gpus: int
) -> tuple[list, list, dict[str, str], str]:
    """Each node's launcher (a launch host's, launch/pool.py, where the job fits; else a new
    actor in its bundle), where each runs, the environment the driver gives their ranks, and
    which of the two it was."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    renv = dict(ray.get_runtime_context().runtime_env or {})
    why = pool.unfit(renv, procs, gpus, dict(os.environ))
    if why is None:
        key = f"{ray.get_runtime_context().get_job_id()}-{os.getpid()}"
        opened = pool.open_all(pool.placed(pg, 600), key, procs if gpus else 0, renv.get("working_dir"))
        if isinstance(opened, tuple):
            env = {**(renv.get("env_vars") or {}), **secret_env()}
            return *opened, env, "on the cluster's launch hosts"
        missing = opened
        why = f"no launch host on {len(missing)} of its nodes"
        if not renv.get("working_dir"):  # (a host made by a job inherits its runtime_env)
            pool.make(missing)  # (for the next job; not waited for)
    actor_cls: Any = ray.remote(NodeLauncherImpl)
    actors: list[Any] = [
        actor_cls.options(
            num_cpus=cpus,
            num_gpus=procs if gpus else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
            # NOTE: Ray starts a job's workers at niceness 15 (RAY_worker_niceness), and the
            # launcher's ranks would inherit it: on a shared or busy node they lose the CPU to
            # everything else. The job's own supervisor runs at 0; so do the launchers.
            runtime_env={"env_vars": {"RAY_worker_niceness": "0"}},
        ).remote(r)
        for r in range(nodes)
    ]
    # (no wait for the placement group: the actors are scheduled as soon as their bundle is placed)
    places = ray.get([a.place.remote() for a in actors], timeout=600)
    return actors, places, secret_env(), f"new launcher actors ({why})"


def secret_env() -> dict[str, str]:
    """The job's secrets as its driver read them, for the ranks (store/secrets.py)."""
    names = [n for n in os.environ.get(SECRET_NAMES_ENV, "").split(",") if n]
    return {n: os.environ[n] for n in names if n in os.environ}


def follow(
    actors: list,
    hosts: tuple[str, ...],
    ns: argparse.Namespace,
    t0: float,
    stopping: threading.Event,
    began: float = 0.0,
) -> int:
    """Print every node's lines with its rank until all end; stop all when one fails or on SIGTERM."""
    import ray

    codes: dict[int, int] = {}
    first_line: dict[int, float] = {}
    delays = Backoff(first=POLL, cap=QUIET, factor=1.5, jitter=0.0)

    def one_pass() -> int | None:
        """Every node's new lines printed; the job's exit code once it is decided."""
        if stopping.is_set():
            ray.get([a.stop.remote(ns.stop_grace) for a in actors])
            print(
                f"raystack spmd: stopped; every node's processes ended ({time.time() - t0:.1f}s)", flush=True
            )
            return 143
        for r, (lines, code) in enumerate(ray.get([a.poll.remote() for a in actors])):
            if lines:
                delays.reset()
            for rank, line in lines:
                first_line.setdefault(r, time.time() - t0)
                print(f"[node {r}] {line}" if rank is None else f"[node {r} rank {rank}] {line}", flush=True)
            if code is not None and r not in codes:
                codes[r] = code
                if code != 0:
                    return failed(actors, hosts, {r: code}, ns)
        return 0 if len(codes) == len(actors) else None

    code = until(one_pass, delays.next)
    if code:
        return code
    summary = {
        "nodes": len(actors),
        "hosts": list(hosts),
        "first_line_s": first_line,
        "seconds": round(time.time() - t0, 2),
        "began": round(began, 3),  # (when the driver's imports were done: the benches' breakdown)
    }
    print("SPMD " + json.dumps(summary), flush=True)
    return 0


def failed(actors: list, hosts: tuple[str, ...], failing: dict[int, int], ns: argparse.Namespace) -> int:
    """A node's launcher exited non-zero: the others may follow within FIRST_WINDOW seconds (the
    echo of the first failure: a peer gone, NCCL aborted); the job's failure names the node and
    rank whose own error came first, with its cause line. Then every other node is stopped."""
    import ray

    def all_failed() -> bool | None:
        for r, (lines, code) in enumerate(ray.get([a.poll.remote() for a in actors])):
            for rank, line in lines:
                print(f"[node {r}] {line}" if rank is None else f"[node {r} rank {rank}] {line}", flush=True)
            if code not in (None, 0) and r not in failing:
                failing[r] = code
        return True if len(failing) >= len(actors) else None

    at_most(all_failed, POLL, REAL, FIRST_WINDOW)
    ray.get([a.stop.remote(2.0) for i, a in enumerate(actors) if i not in failing])
    exits = []
    for node, code in failing.items():  # (in the order they were seen)
        tail = ray.get(actors[node].last_lines.remote())
        rank, exit_code = failure(tail, code)
        exits.append((node, tail, rank, exit_code, cause(tail, rank)))
    node, tail, rank, exit_code, why = next((s for s in exits if not noise(s[4], s[3])), exits[0])
    for line in tail[-TAIL:]:
        print(f"[node {node}] | {line}", flush=True)
    who = f"node {node} rank {rank if rank is not None else '?'} exited {exit_words(exit_code)}"
    others = f"; {len(failing) - 1} other node(s) failed after it" if len(failing) > 1 else ""
    print(
        f"raystack spmd: {who}{f': {why}' if why else ''} (host {hosts[node]}, {ns.launcher}){others}; "
        "every other node stopped",
        flush=True,
    )
    return exit_code if 0 < exit_code < 256 else 1


if __name__ == "__main__":
    sys.exit(main())
