"""The interconnect canary: before a GPU cluster is READY, one NCCL all-reduce over every GPU of
every node, with NCCL_DEBUG=INFO read for the transport each connection used (adapters/nccl.py).

The head runs `python -m raystack.allocation.head.canary OUT.json` as a Ray driver in the cluster's
Python, with the cluster's environment (the profile's NCCL and libfabric settings): one actor per
GPU, pinned to its node, joins one process group and all-reduces SIZE_MB a few times. The READY
line, `raystack status` and the cluster record (`canary`) give its bus bandwidth and transports.

A profile that expects a fabric (`fabric: ofi` on Isambard, `fabric: ib`) gets a loud warning
when NCCL went over something else between nodes (TCP sockets, ~17x slower there), or, with
`canary: strict` (`raystack up --canary strict`), a cluster that ends FAILED with the variables
to check. `canary: off` (`--no-canary`) skips it; a cluster without GPUs, or whose Python has no
torch with CUDA, skips it and says why.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from raystack.adapters import nccl
from raystack.allocation.node.context import NodeContext
from raystack.allocation.node.gpus import real_gpus
from raystack.allocation.node.raystart import ray_env
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.waiting import REAL, at_most

log = logging.getLogger("raystack.node")
SIZE_MB, WARMUP, ITERS = 256, 3, 10
TIMEOUT = float(os.environ.get("RAYSTACK_CANARY_TIMEOUT") or 180)  # s, the whole canary
MODES = ("auto", "off", "strict")


class Rank:
    """One GPU's part of the canary (a Ray actor holding that GPU)."""

    def place(self) -> dict[str, Any]:
        import ray
        import torch

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        cuda = torch.cuda.is_available()
        return {
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "port": port,
            "cuda": cuda,
            "device": torch.cuda.get_device_name(0) if cuda else None,
        }

    def allreduce(self, rank: int, world: int, addr: str, port: int) -> dict[str, Any]:
        folder = tempfile.mkdtemp(prefix="rs-canary-")
        log_file = os.path.join(folder, "nccl.log")
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_FILE=log_file)  # (read when NCCL starts)
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)  # (Ray made this actor's GPU the only one it sees)
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
        x = torch.ones(SIZE_MB * 2**20 // 4, device="cuda")
        for _ in range(WARMUP):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / ITERS
        check = torch.ones(1, device="cuda")
        dist.all_reduce(check)
        right = bool(check.item() == world)
        dist.destroy_process_group()
        with open(log_file, errors="replace") as fh:
            lines = [
                ln.rstrip("\n") for ln in fh if " via " in ln or "Using network" in ln or "NET/OFI" in ln
            ]
        return {"rank": rank, "seconds": seconds, "right": right, "lines": lines[:2000]}


def run() -> dict[str, Any]:
    """The canary itself (in a driver connected to the cluster): what it found."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init()
    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
    if not nodes:
        return {"state": "skipped", "why": "no GPUs in Ray"}
    actor: Any = ray.remote(Rank)
    ranks = [
        actor.options(
            num_gpus=1,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote()
        for n in nodes
        for _ in range(int(n["Resources"]["GPU"]))
    ]
    places = ray.get([r.place.remote() for r in ranks], timeout=TIMEOUT)
    if not all(p["cuda"] for p in places):
        return {"state": "skipped", "why": "torch in the cluster's Python sees no CUDA device"}
    world, host_of = len(ranks), {i: p["host"] for i, p in enumerate(places)}
    found = ray.get(
        [r.allreduce.remote(i, world, places[0]["ip"], places[0]["port"]) for i, r in enumerate(ranks)],
        timeout=TIMEOUT,
    )
    seen = nccl.parse([ln for f in found for ln in f["lines"]], host_of)
    slowest = max(f["seconds"] for f in found)
    busbw = SIZE_MB * 2**20 * 2 * (world - 1) / world / slowest / 1e9 if world > 1 else None
    return {
        "state": "ok" if all(f["right"] for f in found) else "wrong sum",
        "gpus": world,
        "nodes": len(nodes),
        "device": places[0]["device"],
        "size_mb": SIZE_MB,
        "busbw_gbps": round(busbw, 1) if busbw else None,
        "within": sorted(seen.within),
        "between": sorted(seen.between),
        "network": seen.network,
        "provider": seen.provider,
    }


def at_ready(
    ctx: NodeContext, beat: Callable[[], None], env: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """Run the canary before READY (the head's duty), beating meanwhile; what it found, with a
    warning where NCCL missed the profile's fabric. Raises RaystackError for `strict`."""
    mode = (env.get("RAYSTACK_CANARY") or "auto").lower()
    if mode == "off":
        return {"state": "off", "why": "canary: off (--no-canary)"}
    if not ctx.gpus:
        return {"state": "skipped", "why": "no GPUs in the allocation (nothing for NCCL to carry)"}
    if not real_gpus():  # (the testbed's GPUs are character devices standing in for them)
        return {"state": "skipped", "why": "no NVIDIA driver on the head (nvidia-smi not found)"}
    found = _run_driver(ctx, beat)
    if found.get("state") == "ok":
        problem = nccl.fabric_problem(
            nccl.Interconnect(set(found["within"]), set(found["between"])),
            env.get("RAYSTACK_FABRIC"),
            found["nodes"],
        )
        if problem:
            found["warning"] = problem
            log.warning("INTERCONNECT: %s", problem)
            if mode == "strict":
                raise RaystackError(
                    f"interconnect canary (canary: strict): {problem}; the cluster is not started"
                )
    log.info("%s", nccl.canary_words(found))
    return found


def _run_driver(ctx: NodeContext, beat: Callable[[], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rs-canary-") as folder:
        out = Path(folder) / "canary.json"
        env = {**ray_env(ctx), "RAY_ADDRESS": str(records.read(ctx.cluster).gcs_address)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "raystack.allocation.head.canary", str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )

        def ended() -> bool | None:
            beat()
            return None if proc.poll() is None else True

        at_most(ended, 0.5, REAL, TIMEOUT + 30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            return {"state": "failed", "why": f"no answer within {TIMEOUT + 30:.0f}s"}
        lines = (proc.stdout.read() if proc.stdout else "").strip().splitlines()
        try:
            return dict(json.loads(out.read_text()))
        except (OSError, ValueError):
            return {"state": "failed", "why": (lines[-1] if lines else f"exit code {proc.returncode}")[:300]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        found = run()
    except Exception as exc:  # (a torch without NCCL, a node that cannot reach another): said, not fatal
        found = {"state": "failed", "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
    Path(args[0]).write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
