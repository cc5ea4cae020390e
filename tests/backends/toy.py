"""A toy scheduler that lives only in the tests: the third backend, which shows that a new
scheduler is the files docs/development.md lists ("A new scheduler") and no others.

It gives an allocation the testbed's nodes (slurm/testbed: one network, uts, pid and mount
namespace each) without SLURM: `submit` enters each node's namespaces (nsenter) and runs the
allocation script there once per node, detached, with the allocation's id, the node's index and
the node list in its environment (TOY_ID, TOY_INDEX, TOY_NODES), as a scheduler's launcher does.
An allocation is found again by that id in its processes' environments (never by pid); it is
RUNNING while a node program of it lives and ENDED once none does. No walltime, no queue.

Plugged in as another package's backend would be: an entry point in the group
`raystack.backends` (the test writes its dist-info on PYTHONPATH, tests/testbed/test_toy_backend.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from raystack.adapters.allocator import Allocator, AllocInfo, AllocState, NodeFacts, Request, Script, register

ID, INDEX, NODES = "TOY_ID", "TOY_INDEX", "TOY_NODES"
NODE_PROGRAM = b"raystack.allocation.node"
TESTBED_DIR = Path(os.environ.get("RAYSTACK_TESTBED_DIR", "/var/lib/raystack-testbed"))
ENDED = "every node program of it has ended"


def node_pid(host: str) -> int:
    """The pid (in this namespace) of a testbed node's first process: its namespaces are the node."""
    outer = (TESTBED_DIR / "run" / f"{host}.pid").read_text().strip()
    return int(Path(f"/proc/{outer}/task/{outer}/children").read_text().split()[0])


def processes(alloc_id: str, node_programs: bool = False) -> list[int]:
    """Every process that carries the allocation's id (only its node programs, if asked)."""
    needle, found = f"{ID}={alloc_id}\0".encode(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            ours = cmdline and (not node_programs or NODE_PROGRAM in cmdline)
            if ours and needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
    return found


def nodes_of(alloc_id: str) -> list[str]:
    return [f"node{i + 1}" for i in range(int(alloc_id.rsplit("-", 1)[1]))]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class ToyAllocator(Allocator):
    """Allocations of the testbed's first nodes, started by entering their namespaces."""

    backend = "toy"
    label = "toy allocation"
    remote = True
    walltime = False

    def submit(self, script: Path, request: Request) -> str:
        alloc_id = f"toy{secrets.token_hex(3)}-{request.nodes or 1}"  # (its node count: node1 ... nodeN)
        hosts = nodes_of(alloc_id)
        log = Path(str(request.output or "/dev/null").replace("%j", alloc_id))
        for index, host in enumerate(hosts):
            env = {**os.environ, ID: alloc_id, INDEX: str(index), NODES: ",".join(hosts)}
            enter = ["nsenter", "-t", str(node_pid(host)), "-n", "-u", "-p", "-m", "--"]
            with open(log, "ab") as out:
                subprocess.Popen(
                    [*enter, "bash", str(script)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        return alloc_id

    def render(self, script: Script) -> str:
        gpus = ",".join(str(i) for i in range(script.request.gpus_per_node))
        return "\n".join(
            [
                "#!/bin/bash",
                "# A toy allocation (tests/backends/toy.py): this script runs once on every node.",
                "set -euo pipefail",
                "umask 077",
                *script.environment,
                f"export CUDA_VISIBLE_DEVICES={gpus}" if gpus else "",
                'exec "$RAYSTACK_PYTHON" -m raystack.allocation.node',
                "",
            ]
        )

    def facts(self, env: Mapping[str, str]) -> NodeFacts | None:
        if not env.get(ID):
            return None
        nodes = env[NODES].split(",")
        gpus = len([d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d])
        cpus = len(os.sched_getaffinity(0))
        return NodeFacts(env[ID], int(env[INDEX]), len(nodes), gpus, cpus, nodelist=env[NODES])

    def info(self, alloc_id: str) -> AllocInfo | None:
        nodes = nodes_of(alloc_id)
        living = bool(processes(alloc_id, node_programs=True))
        state, reason = (AllocState.RUNNING, "") if living else (AllocState.ENDED, ENDED)
        return AllocInfo(alloc_id, state, reason, "raystack-toy", ",".join(nodes), len(nodes))

    def cancel(self, alloc_id: str) -> None:
        signal_all(processes(alloc_id, node_programs=True), signal.SIGTERM)

    def release(self, alloc_id: str) -> None:
        """A node program that ends the allocation ends it everywhere (as scancel would)."""
        signal_all([p for p in processes(alloc_id, node_programs=True) if p != os.getpid()], signal.SIGTERM)

    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        return nodes_of(alloc_id)

    def sweep(self, alloc_id: str) -> list[int]:
        """What its node programs left once they have gone (SLURM's cgroups would end it)."""
        if processes(alloc_id, node_programs=True):
            return []
        left = processes(alloc_id)
        signal_all(left, signal.SIGKILL)
        return left

    def why_ended(self, info: AllocInfo) -> tuple[str, str]:
        return "scancel", f"the toy allocation ended ({info.reason})"


register(ToyAllocator())
