"""One node's SPMD launcher: started in a launcher actor of the job (launch/spmd.py) or on the
node's launch host (launch/pool.py), it runs the launcher in its own process group and keeps its
output, and each rank's, for the job's driver."""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
from typing import Any

from raystack.launch import NODE_TMP_ENV, SUBMIT_DIR_ENV
from raystack.launch.launchers import CONSOLE_COPY, rank_of
from raystack.launch.process import after_exit, die_with_parent
from raystack.waiting import REAL


def rank_env(job_env: dict[str, str], base: dict[str, str], workdir: str | None) -> dict[str, str]:
    """The ranks' environment: the job's variables over `base` (the launcher's own, or a launch
    host's), and the job's working_dir first on PYTHONPATH (as Ray's working_dir plugin puts it)."""
    env = {**base, **job_env}
    if workdir:
        before = env.get("PYTHONPATH")
        env["PYTHONPATH"] = workdir + (os.pathsep + before if before else "")
    return env


def environ_of(pid: str) -> dict[str, str] | None:
    """A process's environment as it started (None where it cannot be read)."""
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as fh:
            pairs = [item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item]
    except (OSError, ValueError):
        return None
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def omp_is_rays(job_env: dict[str, str], in_job: bool) -> bool:
    """Whether this Ray worker's OMP_NUM_THREADS is the one Ray set from the worker's CPUs (a
    launcher actor: the whole node's; a launch host: 1), not the job's (`job_env`; `in_job`: the
    env_vars of the job this worker belongs to too) or the node's own."""
    node = environ_of(os.environ.get("RAY_RAYLET_PID", ""))
    if node is None or "OMP_NUM_THREADS" in node or "OMP_NUM_THREADS" in job_env:
        return False
    if in_job:
        import ray

        return "OMP_NUM_THREADS" not in ((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})
    return True


class NodeLauncherImpl:
    """Runs one node's launcher in its own process group and keeps its output for the driver:
    the launcher's own lines from its pipe, and each rank's from the files the launcher writes
    for it (launchers.rank_log_args), always whole lines, each with its rank."""

    def __init__(self, node_rank: int, base: dict[str, str] | None = None, workdir: str | None = None):
        self.node_rank = node_rank
        # (a launch host's: the environment its ranks start from, the job's working_dir on its
        # node, the node's GPUs; a launcher actor of the job has all three from Ray)
        self.base, self.workdir = base, workdir
        self.gpus: list[str] | None = None
        self.proc: subprocess.Popen | None = None
        self.lines: collections.deque[tuple[int | None, str]] = collections.deque()
        self.tail: collections.deque[str] = collections.deque(maxlen=400)
        self.lock = threading.Lock()
        self.scan_lock = threading.Lock()
        # (node-local: in the node's temp folder, which goes with the cluster even where this
        # launcher is killed before it removes it)
        self.logdir = tempfile.mkdtemp(prefix="rs-ranks-", dir=os.environ.get(NODE_TMP_ENV) or None)
        self.procs = 1
        self.files: dict[str, tuple[int, bytes]] = {}  # path -> (offset read, partial line)
        self.seen_rank_files = False

    def place(self) -> dict[str, Any]:
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return {
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "port": port,
            "gpus": self.gpus if self.gpus is not None else [str(g) for g in ray.get_gpu_ids()],
            "logdir": self.logdir,
        }

    def start(
        self, command: list[str], files: dict[str, str], procs: int = 1, env: dict[str, str] | None = None
    ) -> int:
        """Start the node's launcher; `env`: what the job's driver adds (its secrets; on a launch
        host, the job's env_vars too)."""
        self.procs = procs
        for path, text in files.items():
            with open(path, "w") as fh:
                fh.write(text)
        full = rank_env(env or {}, dict(os.environ) if self.base is None else self.base, self.workdir)
        # NOTE: Ray sets OMP_NUM_THREADS for its workers from their CPUs: every rank of a launcher
        # actor would run the node's CPU count of threads (8 ranks x 72 on a node of 72 cores).
        # Unless the job or the node set it, the launcher chooses, as under srun (torchrun: 1).
        if "OMP_NUM_THREADS" in full and omp_is_rays(env or {}, in_job=self.base is None):
            full.pop("OMP_NUM_THREADS", None)
        if self.gpus:
            full["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        folder = self.workdir or full.get(SUBMIT_DIR_ENV)  # (a job without a working_dir runs there)
        if folder and not os.path.isdir(folder):
            here = os.getcwd()
            self._add(None, f"raystack spmd: warning: no folder {folder} on this node; ranks run in {here}")
            folder = None
        full["PWD"] = folder or os.getcwd()  # (a shell's, as where the ranks start)
        self.proc = subprocess.Popen(
            command,
            env=full,
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
        # and so does the rank-log folder with DeepSpeed's hostfile (every rs-ranks-* folder and
        # hostfile was left in /tmp while the watcher was this actor's child: process.after_exit).
        # (its rank-log folder removed, the launch is done: a launch host's, closed by its driver)
        after_exit(f"kill -9 -{self.proc.pid} 2>/dev/null; rm -rf {shlex.quote(self.logdir)}", self.logdir)
        threading.Thread(target=self._read, daemon=True).start()
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

    def _scan(self, final: bool) -> None:
        """Append the rank files' new complete lines (at the end, their last partial line too).
        (Read when the driver asks, not by a thread of its own: on a node's shared cores, every
        wake-up is taken from the ranks.)"""
        with self.scan_lock:
            self._scan_files(final)

    def _scan_files(self, final: bool) -> None:
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
        elif self.proc is not None:
            self._scan(final=False)
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
