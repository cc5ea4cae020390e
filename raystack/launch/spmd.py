"""SPMD jobs (torchrun, the DeepSpeed launcher, accelerate) on the persistent cluster.

`python -m raystack.launch.spmd --launcher torchrun [--nodes N] [--procs-per-node P] -- CMD...`
is the driver of a `kind: spmd` job. It holds one bundle per node (STRICT_SPREAD: that node's
GPUs and CPUs), starts one NodeLauncher actor in each, and each runs the launcher with the
rendezvous (node 0's address and a free port there) and the GPUs Ray assigned it
(CUDA_VISIBLE_DEVICES). No hostfile to write and no ssh: this replaces both.

Every line a launcher prints reaches the job's log prefixed with its node rank, like `srun
--label`, and every line of a rank with its rank too (`[node 1 rank 3] ...`): each rank writes
to files of its own (the launcher's option for it), read back as whole lines, so two ranks of a
node never glue their lines together. When one launcher exits non-zero the others are stopped at
once and the job fails naming the node, the rank and the exit code, with that node's last lines.
SIGTERM (`raystack stop`, a timeout, the walltime warning) stops every node's processes; and a
launcher whose actor dies is killed by a watchdog process beside it, so nothing is left holding
a GPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from raystack.launch import SECRET_NAMES_ENV, SUBMIT_DIR_ENV
from raystack.launch.launchers import (
    CONSOLE_COPY,
    LAUNCHERS,
    Rendezvous,
    argv,
    cause,
    exit_words,
    failure,
    hostfile,
    noise,
    rank_of,
)
from raystack.launch.process import die_with_parent
from raystack.waiting import REAL, at_most, until

POLL = 0.2  # seconds between reads of the launchers' output
TAIL = 20  # lines of a failed node shown in the job's failure
FIRST_WINDOW = 3.0  # seconds to see which other nodes fail after the first (whose error came first)


class NodeLauncherImpl:
    """Runs one node's launcher in its own process group and keeps its output for the driver:
    the launcher's own lines from its pipe, and each rank's from the files the launcher writes
    for it (launchers.rank_log_args), always whole lines, each with its rank."""

    def __init__(self, node_rank: int):
        self.node_rank = node_rank
        self.proc: subprocess.Popen | None = None
        self.lines: collections.deque[tuple[int | None, str]] = collections.deque()
        self.tail: collections.deque[str] = collections.deque(maxlen=400)
        self.lock = threading.Lock()
        self.logdir = tempfile.mkdtemp(prefix="rs-ranks-")  # (node-local: this actor's node)
        self.procs = 1
        self.files: dict[str, tuple[int, bytes]] = {}  # path -> (offset read, partial line)
        self.seen_rank_files = False

    def where(self) -> dict[str, Any]:
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return {
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "port": port,
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "logdir": self.logdir,
        }

    def start(
        self, command: list[str], files: dict[str, str], procs: int = 1, env: dict[str, str] | None = None
    ) -> int:
        """Start the node's launcher; `env`: what the job's driver adds (its secrets)."""
        self.procs = procs
        for path, text in files.items():
            with open(path, "w") as fh:
                fh.write(text)
        folder = os.environ.get(SUBMIT_DIR_ENV)  # (a job without a working_dir runs there)
        if folder and not os.path.isdir(folder):
            here = os.getcwd()
            self._add(None, f"raystack spmd: warning: no folder {folder} on this node; ranks run in {here}")
            folder = None
        self.proc = subprocess.Popen(
            command,
            env={**os.environ, **env} if env else None,
            cwd=folder or None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as one
            preexec_fn=die_with_parent,
            text=True,
            errors="replace",
            bufsize=1,
        )
        # NOTE: the same guard as Ray's own job supervisor: if this actor dies (SIGKILL included),
        # the launcher's whole process group goes too (PDEATHSIG alone would spare its children),
        # and so does the rank-log folder with DeepSpeed's hostfile. The watcher is started in the
        # background of a shell that exits at once, so it is not this actor's child: Ray kills a
        # worker's children when it exits, and the watcher died before it could clean (every
        # rs-ranks-* folder and hostfile was left in /tmp).
        watch = f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done"
        clean = f"{watch}; kill -9 -{self.proc.pid} 2>/dev/null; rm -rf {shlex.quote(self.logdir)}"
        subprocess.run(
            f"( {clean} ) </dev/null >/dev/null 2>&1 &",
            shell=True,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._follow_ranks, daemon=True).start()
        return self.proc.pid

    def _add(self, rank: int | None, text: str) -> None:
        with self.lock:
            self.lines.append((rank, text))
            self.tail.append(text if rank is None else f"[rank{rank}] {text}")

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.seen_rank_files and CONSOLE_COPY.match(line):
                continue  # (accelerate's --tee copy of a line the rank files give whole)
            self._add(None, line.rstrip("\n"))

    def _follow_ranks(self) -> None:
        assert self.proc is not None
        proc = self.proc

        def scanned() -> bool | None:
            self._scan(final=False)
            return None if proc.poll() is None else True

        until(scanned, POLL)

    def _scan(self, final: bool) -> None:
        """Append the rank files' new complete lines (at the end, their last partial line too)."""
        for folder, _, names in os.walk(self.logdir):
            for name in sorted(names):
                path = os.path.join(folder, name)
                rank = rank_of(path, self.node_rank, self.procs)
                if rank is None:
                    continue
                self.seen_rank_files = True
                offset, partial = self.files.get(path, (0, b""))
                try:
                    with open(path, "rb") as fh:
                        fh.seek(offset)
                        data = fh.read()
                except OSError:
                    continue
                *whole, partial = (partial + data).split(b"\n")
                if final and partial:
                    whole, partial = [*whole, partial], b""
                for line in whole:
                    self._add(rank, line.decode(errors="replace").rstrip("\r"))
                self.files[path] = (offset + len(data), partial)

    def poll(self) -> tuple[list[tuple[int | None, str]], int | None]:
        """New output lines (rank or None for the launcher's own, text), and the launcher's exit
        code once it has ended (and every line of it and its ranks has been read)."""
        code = self.proc.poll() if self.proc else None
        if code is not None and self.proc and self.proc.stdout and not self.proc.stdout.closed:
            REAL.sleep(0.05)  # the reader thread catches the launcher's last lines
            self._scan(final=True)
        with self.lock:
            out = list(self.lines)
            self.lines.clear()
        return out, code

    def last_lines(self) -> list[str]:
        with self.lock:
            return list(self.tail)

    def stop(self, grace: float) -> int | None:
        """SIGTERM the launcher's process group, SIGKILL what is left after `grace` seconds."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the workers too, even if the launcher left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        return self.proc.returncode


def parse(args: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m raystack.launch.spmd", description=__doc__.splitlines()[0])
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


def main(args: list[str] | None = None) -> int:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ns = parse(sys.argv[1:] if args is None else args)
    began = time.time()
    ray.init()
    stopping = threading.Event()  # SIGTERM: `raystack stop`, a timeout, the walltime warning
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())  # NOTE: after ray.init (it sets one)
    t0 = time.time()
    alive = rank_nodes(ray.nodes())
    nodes = ns.nodes or len(alive)
    gpus_per_node = int(min(n["Resources"].get("GPU", 0) for n in alive))
    cpus_per_node = int(min(n["Resources"].get("CPU", 1) for n in alive))
    procs = ns.procs_per_node or gpus_per_node or 1
    if nodes > len(alive) or (gpus_per_node and procs > gpus_per_node):
        have = f"{len(alive)} nodes x {gpus_per_node} GPUs"
        print(f"raystack spmd: {nodes} nodes x {procs} processes do not fit {have}")
        return 2
    bundle = {"CPU": cpus_per_node, **({"GPU": procs} if gpus_per_node else {})}
    # (no wait for pg.ready(): the actors are scheduled as soon as their bundle is placed)
    pg = placement_group([bundle] * nodes, strategy="STRICT_SPREAD")
    actor_cls: Any = ray.remote(NodeLauncherImpl)
    actors: list[Any] = [
        actor_cls.options(
            num_cpus=cpus_per_node,
            num_gpus=procs if gpus_per_node else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
            # NOTE: Ray starts a job's workers at niceness 15 (RAY_worker_niceness), and the
            # launcher's ranks would inherit it: on a shared or busy node they lose the CPU to
            # everything else. The job's own supervisor runs at 0; so do the launchers.
            runtime_env={"env_vars": {"RAY_worker_niceness": "0"}},
        ).remote(r)
        for r in range(nodes)
    ]
    places = ray.get([a.where.remote() for a in actors], timeout=600)
    placed = time.time()
    hosts = tuple(p["host"] for p in places)
    starts = []
    for r, actor in enumerate(actors):
        rdv = Rendezvous(nodes, r, procs, places[0]["ip"], places[0]["port"], hosts, bool(gpus_per_node))
        files = {}
        hf = ""
        if ns.launcher == "deepspeed":
            # (in the node's rank-log folder, which goes with its launcher actor: it was left in /tmp)
            hf = os.path.join(places[r]["logdir"], "hostfile")
            files[hf] = hostfile(rdv)
        line = argv(ns.launcher, rdv, ns.command, ns.launcher_arg, hf, places[r]["logdir"])
        print(f"raystack spmd: node {r} ({hosts[r]}): {shlex.join(line)}", flush=True)
        starts.append(actor.start.remote(line, files, procs, secret_env()))
    ray.get(starts)
    print(
        f"raystack spmd: {ns.launcher} on {nodes} nodes x {procs} processes ({', '.join(hosts)}), "
        f"rendezvous {places[0]['ip']}:{places[0]['port']}, GPUs {[p['gpus'] for p in places]}; "
        f"connected in {t0 - began:.2f}s, nodes placed {placed - t0:.2f}s after, launchers started "
        f"{time.time() - placed:.2f}s after",
        flush=True,
    )
    return follow(actors, hosts, ns, t0, stopping)


def secret_env() -> dict[str, str]:
    """The job's secrets as its driver read them, for the ranks (store/secrets.py)."""
    names = [n for n in os.environ.get(SECRET_NAMES_ENV, "").split(",") if n]
    return {n: os.environ[n] for n in names if n in os.environ}


def follow(
    actors: list, hosts: tuple[str, ...], ns: argparse.Namespace, t0: float, stopping: threading.Event
) -> int:
    """Print every node's lines with its rank until all end; stop all when one fails or on SIGTERM."""
    import ray

    codes: dict[int, int] = {}
    first_line: dict[int, float] = {}

    def one_pass() -> int | None:
        """Every node's new lines printed; the job's exit code once it is decided."""
        if stopping.is_set():
            ray.get([a.stop.remote(ns.stop_grace) for a in actors])
            print(
                f"raystack spmd: stopped; every node's processes ended ({time.time() - t0:.1f}s)", flush=True
            )
            return 143
        for r, (lines, code) in enumerate(ray.get([a.poll.remote() for a in actors])):
            for rank, line in lines:
                first_line.setdefault(r, time.time() - t0)
                print(f"[node {r}] {line}" if rank is None else f"[node {r} rank {rank}] {line}", flush=True)
            if code is not None and r not in codes:
                codes[r] = code
                if code != 0:
                    return failed(actors, hosts, {r: code}, ns)
        return 0 if len(codes) == len(actors) else None

    code = until(one_pass, POLL)
    if code:
        return code
    summary = {
        "nodes": len(actors),
        "hosts": list(hosts),
        "first_line_s": first_line,
        "seconds": round(time.time() - t0, 2),
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
    said = []
    for node, code in failing.items():  # (in the order they were seen)
        tail = ray.get(actors[node].last_lines.remote())
        rank, exit_code = failure(tail, code)
        said.append((node, tail, rank, exit_code, cause(tail, rank)))
    node, tail, rank, exit_code, why = next((s for s in said if not noise(s[4], s[3])), said[0])
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
