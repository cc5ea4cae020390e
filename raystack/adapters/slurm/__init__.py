"""The one adapter to SLURM: every SLURM command raystack runs goes through `_run`.

Only machine-readable output is parsed: `sbatch --parsable`, `squeue --noheader --format` with
fixed '|'-separated fields (the job name last: it may hold anything), `sacct --parsable2`,
`sinfo --noheader --format`. Queries name the job they ask about (never a whole-cluster
listing: megabytes on a busy site) and are cached for a second, so one command asks once.
The parsers of what the commands print are pure, in parse.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from raystack.adapters.allocator import (
    Allocator,
    AllocInfo,
    AllocState,
    NodeFacts,
    NodeShape,
    Request,
    Script,
    register,
)
from raystack.adapters.slurm.options import check as check_option
from raystack.adapters.slurm.parse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    STATES,
    gone,
    parse_cpus_per_node,
    parse_restart_count,
    parse_sacct,
    parse_sbatch_parsable,
    parse_sinfo_nodes,
    parse_sinfo_out,
    parse_sinfo_time_limits,
    parse_squeue,
    parse_squeue_commands,
)
from raystack.adapters.slurm.reasons import NEVER_STARTS, NODES_OUT
from raystack.adapters.slurm.script import options, render
from raystack.errors import (
    AccountingDisabled,
    AllocationEnding,
    AllocationNotFound,
    SchedulerError,
    SchedulerMissing,
    SchedulerUnavailable,
)

log = logging.getLogger("raystack")

CACHE_TTL = 1.0  # seconds a job's state is reused within one process


# ---------------------------------------------------------------------------- command runner


def _run(argv: Sequence[str], *, timeout: float = 60) -> str:
    """Run one SLURM command; return stdout or raise SchedulerError with its stderr."""
    if shutil.which(argv[0]) is None:
        raise SchedulerMissing(
            f"`{argv[0]}` is not on PATH: no SLURM here; run it on this machine with `raystack up --local`, "
            "or on a SLURM login node (or after `module load slurm`)"
        )
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SchedulerUnavailable(f"`{' '.join(argv)}` did not answer within {timeout:.0f}s") from exc
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().replace("\n", " ")
        raise refusal(message)(f"`{' '.join(argv[:2])}` failed: {message or f'exit {proc.returncode}'}")
    return proc.stdout


# What SLURM's commands print when they refuse, as the error type callers act on (the only place
# their texts are read).
REFUSALS: tuple[tuple[str, type[SchedulerError]], ...] = (
    ("Invalid job id", AllocationNotFound),
    ("already completing", AllocationEnding),
    ("accounting storage is disabled", AccountingDisabled),
    ("Unable to contact slurm controller", SchedulerUnavailable),
    ("Socket timed out", SchedulerUnavailable),
    ("Could not establish a configuration source", SchedulerUnavailable),  # (no slurm.conf, no DNS SRV)
)


def refusal(message: str) -> type[SchedulerError]:
    """The error type of a SLURM command's complaint."""
    return next((kind for text, kind in REFUSALS if text in message), SchedulerError)


# ---------------------------------------------------------------------------- parsers (pure)
STATES["GONE"] = AllocState.GONE  # (raystack's word: no squeue line and no accounting row)


# ---------------------------------------------------------------------------- commands
def sbatch(options: Sequence[str], script: str) -> str:
    """Submit `script` (a path) with `options`; return the job id. SLURM's refusal is raised."""
    return parse_sbatch_parsable(_run(["sbatch", "--parsable", *options, script]))


def job_info(job_id: str) -> AllocInfo | None:
    """One job's state: `squeue --jobs=ID`, then sacct for a job slurmctld has forgotten (asked
    every time; SlurmAllocator keeps answers for CACHE_TTL).

    GONE only when SLURM says so: squeue answers "Invalid job id" AND accounting has no row
    (or is disabled). None when SLURM could not be asked: an error is never an answer.
    """
    try:
        out = _run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}", f"--format={SQUEUE_FORMAT}"])
        found = parse_squeue(out).get(job_id)
        if found is not None:
            return found
    except AllocationNotFound:
        pass
    except SchedulerError:
        return None
    try:
        out = _run(["sacct", "--parsable2", "--noheader", "-j", job_id, "--format=" + ",".join(SACCT_FIELDS)])
        return parse_sacct(out).get(job_id) or gone(job_id)
    except AccountingDisabled:
        return gone(job_id)
    except SchedulerError:
        return None


def jobs_named(name: str, user: str | None = None) -> dict[str, AllocInfo]:
    """This user's jobs called `name` that slurmctld knows (active or recently finished), each with
    the script it runs (`command`: which cluster folder it belongs to)."""
    # (never every user's: another user's cluster of the same name is no twin of this one)
    user = user or os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())
    argv = ["squeue", "--noheader", f"--name={name}", "--format=%i|%T|%o", f"--user={user}"]
    return parse_squeue_commands(_run(argv), name)


def restart_count(job_id: str) -> int | None:
    """How often SLURM has requeued the job (`scontrol requeue`, a preemption or node failure that
    requeues): squeue's RestartCnt, which grows as the requeue begins, while the job's tasks are
    still being ended. None when SLURM cannot say."""
    try:
        return parse_restart_count(_run(["squeue", "--noheader", f"--jobs={job_id}", "--Format=RestartCnt"]))
    except SchedulerError:
        return None


def nodes_out(partition: str | None) -> tuple[int, dict[str, str]]:
    """The partition's nodes that can run jobs now, and those that cannot, from sinfo."""
    return parse_sinfo_out(_run(["sinfo", "--noheader", "--Node", "--format=%N|%P|%T|%E"]), partition)


def node_shape(partition: str | None) -> NodeShape:
    """CPUs, GPUs and memory per node of `partition` (or the default one), from sinfo."""
    return parse_sinfo_nodes(_run(["sinfo", "--noheader", "--Node", "--format=%N|%P|%c|%G|%m|%f"]), partition)


def time_limit(partition: str | None) -> tuple[str, int | None] | None:
    """The partition's (or the default one's) time limit, from sinfo: see parse_sinfo_time_limits."""
    return parse_sinfo_time_limits(_run(["sinfo", "--noheader", "--format=%P|%l"]), partition)


def scancel(job_id: str) -> None:
    """Cancel a job; cancelling a finished job is not an error."""
    with contextlib.suppress(AllocationNotFound, AllocationEnding):
        _run(["scancel", job_id])


def hostnames(nodelist: str) -> list[str]:
    """Expand a SLURM node list ("node[1-3],gpu7") into host names, in SLURM's order."""
    return _run(["scontrol", "show", "hostnames", nodelist]).split()


# ---------------------------------------------------------------------------- a node program's facts


def gpus_on_node(env: Mapping[str, str]) -> int:
    """GPUs SLURM gave this node: SLURM_GPUS_ON_NODE, else the CUDA_VISIBLE_DEVICES entries."""
    if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(env["SLURM_GPUS_ON_NODE"])
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in visible.split(",") if d.strip()]) if visible else 0


def facts(env: Mapping[str, str]) -> NodeFacts | None:
    """A node program's facts from the environment srun gives its task; None outside SLURM."""
    alloc_id = env.get("SLURM_JOB_ID")
    if not alloc_id:
        return None
    return NodeFacts(
        alloc_id=alloc_id,
        node_index=int(env.get("SLURM_NODEID", "0")),
        node_count=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1),
        gpus=gpus_on_node(env),
        cpus=int(env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1),
        restart=int(env.get("SLURM_RESTART_COUNT") or 0),
        nodelist=env.get("SLURM_JOB_NODELIST", ""),
        cpus_per_node=parse_cpus_per_node(env.get("SLURM_JOB_CPUS_PER_NODE", "")),
    )


class SlurmAllocator(Allocator):
    """Answers are kept for CACHE_TTL: one command asks SLURM once per allocation. When an
    ask found SLURM not answering (squeue gave up after its own timeout, SLOW_FAILURE or more),
    nobody here asks again for QUIET seconds: "unknown" at once, not another wait as long."""

    backend = "slurm"
    label = "SLURM job"
    remote = True
    command = "sbatch"
    own_env = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
    SLOW_FAILURE = 5.0
    QUIET = 30.0

    def check_native(self, option: str, source: str = "", profile: bool = False) -> str:
        return check_option(option, source or "--sbatch", profile)

    def never_starts(self, info: AllocInfo) -> tuple[str, str] | None:
        return NEVER_STARTS.get(info.reason)

    def waits_for_nodes_out(self, info: AllocInfo) -> bool:
        return info.reason.startswith(NODES_OUT)

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache: dict[str, tuple[float, AllocInfo | None]] = {}
        self.clock = clock
        self.quiet_until = 0.0

    def submit(self, script: Path, request: Request) -> str:
        return sbatch(options(request), str(script))

    def argv(self, script: Path, request: Request) -> list[str]:
        return ["sbatch", "--parsable", *options(request), str(script)]

    def render(self, script: Script) -> str:
        return render(script)

    def facts(self, env: Mapping[str, str]) -> NodeFacts | None:
        return facts(env)

    def named(self, name: str) -> list[AllocInfo]:
        return list(jobs_named(name).values())

    def node_shape(self, queue: str | None) -> NodeShape | None:
        return node_shape(queue)

    def time_limit(self, queue: str | None) -> tuple[str, int | None] | None:
        return time_limit(queue)

    def nodes_out(self, queue: str | None) -> tuple[int, dict[str, str]] | None:
        return nodes_out(queue)

    def info(self, alloc_id: str) -> AllocInfo | None:
        cached = self.cache.get(alloc_id)
        if cached and self.clock() - cached[0] < CACHE_TTL:
            return cached[1]
        if self.clock() < self.quiet_until:
            return None
        asked = self.clock()
        info = job_info(alloc_id)
        if info is None and self.clock() - asked >= self.SLOW_FAILURE:
            self.quiet_until = self.clock() + self.QUIET
            log.warning(
                "raystack: warning: SLURM did not answer in %.0fs (slurmctld busy or down?); "
                "clusters are shown as last recorded",
                self.clock() - asked,
            )
        self.cache[alloc_id] = (self.clock(), info)
        return info

    def cancel(self, alloc_id: str) -> None:
        self.forget(alloc_id)
        scancel(alloc_id)

    def release(self, alloc_id: str) -> None:
        self.cancel(alloc_id)

    def forget(self, alloc_id: str | None = None) -> None:
        if alloc_id is None:
            self.cache.clear()
        else:
            self.cache.pop(alloc_id, None)

    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        return hostnames(nodelist)

    def restarts(self, alloc_id: str) -> int | None:
        return restart_count(alloc_id)

    def why_ended(self, info: AllocInfo) -> tuple[str, str]:
        reason = (info.reason or "").lower()
        if "timelimit" in reason or info.native == "TIMEOUT":
            return "walltime", "walltime"
        if "node" in reason or info.native == "NODE_FAIL":
            return "node lost", f"node failure ({info.reason or info.state_text})"
        if "preempt" in reason or info.native == "PREEMPTED":
            return "preempted", "preempted"
        return "scancel", "cancelled by scancel or an administrator"

    def time_left(self, info: AllocInfo | None) -> int | None:
        """Seconds to its walltime end while it runs; None without one (or not running)."""
        if info is None or info.state is not AllocState.RUNNING or not info.end_time:
            return None
        return max(0, int(info.end_time - time.time()))


register(SlurmAllocator())
