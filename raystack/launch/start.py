"""Where an SPMD job's launchers go and how they start, the same for the job's driver
(spmd.py) and for the head's launch host that starts them as the job is submitted (pool.py,
ahead.py): its command line, the nodes it takes, and every node's launcher with the rendezvous."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from raystack.launch.launchers import LAUNCHERS, Rendezvous, argv, hostfile

DESCRIPTION = "The driver of a kind: spmd job: a launcher on every node it takes."


def parse(args: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m raystack.launch.spmd", description=DESCRIPTION)
    p.add_argument("--launcher", choices=LAUNCHERS, required=True)
    p.add_argument("--nodes", type=int, default=0, help="default: every node of the cluster")
    p.add_argument("--procs-per-node", type=int, default=0, help="default: the node's GPUs, or 1")
    p.add_argument("--launcher-arg", action="append", default=[], help="passed to the launcher (repeatable)")
    p.add_argument("--stop-grace", type=float, default=10.0)
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the script and its arguments")
    ns = p.parse_args(args)
    ns.command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not ns.command:
        p.error("give the command after --, e.g. -- train.py --lr 1e-4")
    return ns


def rank_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alive nodes the ranks go to: those with GPUs where any has some (never the node of a
    head without GPUs, with GPU nodes grown beside it from another partition)."""
    alive = [n for n in nodes if n["Alive"]]
    return [n for n in alive if n["Resources"].get("GPU")] or alive


def layout(ns: argparse.Namespace, all_nodes: list[dict[str, Any]]) -> tuple[int, int, int, dict] | str:
    """The job's nodes, processes per node, GPUs per node and bundle on the cluster as it is (or
    why it does not fit)."""
    alive = rank_nodes(all_nodes)
    nodes = ns.nodes or len(alive)
    gpus_per_node = int(min(n["Resources"].get("GPU", 0) for n in alive))
    cpus_per_node = int(min(n["Resources"].get("CPU", 1) for n in alive))
    procs = ns.procs_per_node or gpus_per_node or 1
    if nodes > len(alive) or (gpus_per_node and procs > gpus_per_node):
        return f"{nodes} nodes x {procs} processes do not fit {len(alive)} nodes x {gpus_per_node} GPUs"
    bundle = {"CPU": cpus_per_node, **({"GPU": procs} if gpus_per_node else {})}
    return nodes, procs, gpus_per_node, bundle


def start_all(
    actors: list, places: list[dict], ns: argparse.Namespace, procs: int, gpus: bool, env: dict
) -> list[str]:
    """Each node's launcher started with the rendezvous at node 0; the lines that say so."""
    import ray

    hosts = tuple(p["host"] for p in places)
    starts, commands = [], []
    for r, actor in enumerate(actors):
        rdv = Rendezvous(len(actors), r, procs, places[0]["ip"], places[0]["port"], hosts, gpus)
        files = {}
        hf = ""
        if ns.launcher == "deepspeed":
            # (in the node's rank-log folder, which goes with its launch: it was left in /tmp)
            hf = os.path.join(places[r]["logdir"], "hostfile")
            files[hf] = hostfile(rdv)
        line = argv(ns.launcher, rdv, ns.command, ns.launcher_arg, hf, places[r]["logdir"])
        commands.append(f"raystack spmd: node {r} ({hosts[r]}): {shlex.join(line)}")
        starts.append(actor.start.remote(line, files, procs, env))
    ray.get(starts)
    return commands
