"""The one adapter to SLURM: every SLURM command raystack runs goes through `_run`.

Only machine-readable output is parsed: `sbatch --parsable`, `squeue --noheader --format` with
fixed '|'-separated fields (the job name last: it may hold anything), `sacct --parsable2`,
`sinfo --noheader --format`. Queries name the job they ask about (never a whole-cluster
listing: megabytes on a busy site) and are cached for a second, so one command asks once.
Parsers are pure functions tested against outputs recorded on the testbed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from raystack import durations
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
from raystack.adapters.slurm.reasons import NEVER_STARTS, NODES_OUT
from raystack.adapters.slurm.script import options, render
from raystack.errors import (
    AccountingDisabled,
    AllocationEnding,
    AllocationNotFound,
    NoSuchPartition,
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
# SLURM's base states (squeue %T, sacct State: without flags) in raystack's words.
STATES = {
    "PENDING": AllocState.WAITING,
    "REQUEUED": AllocState.WAITING,
    "REQUEUE_HOLD": AllocState.WAITING,
    "REQUEUE_FED": AllocState.WAITING,
    "CONFIGURING": AllocState.STARTING,
    "RUNNING": AllocState.RUNNING,
    "RESIZING": AllocState.RUNNING,
    "SIGNALING": AllocState.RUNNING,
    "STAGE_OUT": AllocState.ENDING,
    "SUSPENDED": AllocState.SUSPENDED,
    "STOPPED": AllocState.SUSPENDED,
    "COMPLETING": AllocState.ENDING,
    **dict.fromkeys(
        (
            "COMPLETED",
            "CANCELLED",
            "FAILED",
            "TIMEOUT",
            "NODE_FAIL",
            "PREEMPTED",
            "BOOT_FAIL",
            "DEADLINE",
            "OUT_OF_MEMORY",
            "REVOKED",
            "SPECIAL_EXIT",
        ),
        AllocState.ENDED,
    ),
}
STATES["GONE"] = AllocState.GONE  # (raystack's word: no squeue line and no accounting row)
ABBREVIATED = {"OOM": "OUT_OF_MEMORY", "CA": "CANCELLED"}


def native_state(raw: str) -> str:
    """SLURM's state word of its text ("CANCELLED by 0" -> CANCELLED, "OOM" -> OUT_OF_MEMORY)."""
    word = raw.strip().split(" ")[0].upper().rstrip("+") if raw else ""
    return ABBREVIATED.get(word, word)


def answer(alloc_id: str, raw_state: str, **fields: Any) -> AllocInfo:
    """An AllocInfo from SLURM's state text: its word kept as `native`, its meaning as the state."""
    word = native_state(raw_state)
    return AllocInfo(alloc_id, STATES.get(word, AllocState.UNKNOWN), native=word, **fields)


def gone(alloc_id: str) -> AllocInfo:
    """slurmctld says the id is invalid and accounting has no row for it."""
    return answer(alloc_id, "GONE")


_SBATCH_ID = re.compile(r"(\d+)(?:;\S+)?")
# squeue --format fields; the name last, since it may hold the separator.
SQUEUE_FORMAT = "%i|%T|%r|%N|%D|%S|%e|%l|%j"


def parse_sbatch_parsable(out: str) -> str:
    """`sbatch --parsable` prints `jobid` or `jobid;cluster` on its last line."""
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    match = _SBATCH_ID.fullmatch(lines[-1]) if lines else None
    if not match:
        raise SchedulerError(f"could not read a job id from sbatch output: {out.strip()!r}")
    return match.group(1)


def parse_timestamp(text: str) -> int:
    """SLURM's local ISO time (2026-11-22T02:29:50) as epoch seconds; 0 for N/A, Unknown, None."""
    try:
        return int(time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0


def parse_duration(text: str) -> int:
    """SLURM's time limit as seconds; 0 for UNLIMITED, INVALID, N/A (anything not a time)."""
    try:
        return durations.seconds(text)
    except ValueError:
        return 0


def parse_squeue(text: str) -> dict[str, AllocInfo]:
    """Parse `squeue --noheader --format=SQUEUE_FORMAT` lines into AllocInfo by job id."""
    jobs: dict[str, AllocInfo] = {}
    for line in text.splitlines():
        parts = line.split("|", 8)
        if len(parts) != 9 or not parts[0].strip().isdigit():
            continue
        job_id, state, reason, nodes, count, start, end, limit, name = parts
        jobs[job_id] = answer(
            job_id,
            state,
            reason=reason.strip(),
            name=name,
            nodes=nodes.strip(),
            node_count=int(count) if count.strip().isdigit() else 0,
            start_time=parse_timestamp(start),
            end_time=parse_timestamp(end),
            time_limit_s=parse_duration(limit),
        )
    return jobs


SACCT_FIELDS = ("JobIDRaw", "State", "JobName", "NodeList", "Start", "End", "ExitCode")


def parse_sacct(text: str) -> dict[str, AllocInfo]:
    """Parse `sacct --parsable2 --noheader --format=<SACCT_FIELDS>` (allocation lines only)."""
    jobs: dict[str, AllocInfo] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS) or "." in parts[0]:
            continue  # steps (123.batch, 123.0) are not allocations
        job_id, state, name, nodes, start, end, exit_code = parts
        jobs[job_id] = answer(
            job_id,
            state,
            name=name,
            nodes=nodes,
            start_time=parse_timestamp(start),
            end_time=parse_timestamp(end),
            exit_code=exit_code,
        )
    return jobs


def gres_gpus(gres: str) -> int:
    """GPUs in a GRES string: 'gpu:4', 'gpu:a100:8(S:0-1)', 'gpu:h100:4,nvme:1', '(null)' -> 0."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres):
        fields = re.sub(r"\(.*?\)", "", item).strip().split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def parse_sinfo_nodes(text: str, partition: str | None) -> NodeShape:
    """`sinfo --noheader --Node --format=%N|%P|%c|%G|%m|%f` -> the shape of `partition`'s nodes
    (the default partition, marked '*', when None; without the memory or features field, those
    are unknown). Raises SchedulerError when it has no nodes."""
    rows: dict[str, tuple[int, int]] = {}
    mems: list[int] = []
    features: set[str] | None = None
    default = None
    seen: set[str] = set()
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) not in (4, 5, 6):
            continue
        node, part, cpus, gres = parts[:4]
        if part.endswith("*"):
            part = part[:-1]
            default = part
        seen.add(part)
        if part == (partition or default) and cpus.isdigit():
            rows[node] = (int(cpus), gres_gpus(gres))
            if len(parts) >= 5 and parts[4].isdigit():
                mems.append(int(parts[4]))
            if len(parts) == 6:  # ("(null)" where a node has none)
                features = (features or set()) | {f for f in parts[5].split(",") if f and f != "(null)"}
    name = partition or default
    if partition and seen and partition not in seen:
        raise NoSuchPartition(
            f"no partition {partition!r} here (sinfo lists {', '.join(sorted(seen))}); "
            "name one with --partition or the profile's `partition:`"
        )
    if not rows or name is None:
        where = f"partition '{partition}'" if partition else "the default partition"
        raise SchedulerError(f"sinfo lists no nodes in {where}; name one with --partition")
    shapes = set(rows.values())
    return NodeShape(
        partition=name,
        cpus=min(c for c, _ in shapes),
        gpus=min(g for _, g in shapes),
        nodes=len(rows),
        uniform=len(shapes) == 1,
        mem_mb=min(mems) if mems and len(mems) == len(rows) else None,
        features=frozenset(features) if features is not None else None,
    )


def parse_sinfo_time_limits(text: str, partition: str | None) -> tuple[str, int | None] | None:
    """`sinfo --noheader --format=%P|%l` -> (the partition, its time limit in seconds, None when
    infinite) for `partition` (the default one, marked '*', when None); None where sinfo lists
    no such partition or a limit it does not know how to read."""
    for line in text.splitlines():
        name, _, limit = (p.strip() for p in line.partition("|"))
        default = name.endswith("*")
        name = name.removesuffix("*")
        if name and (name == partition or (partition is None and default)):
            if limit.lower() in ("infinite", "unlimited"):
                return name, None
            try:
                return name, durations.seconds(limit)
            except ValueError:
                return None
    return None


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


def parse_squeue_commands(text: str, name: str) -> dict[str, AllocInfo]:
    """`squeue --noheader --format=%i|%T|%o` lines of jobs called `name` (the command last: a
    path may hold '|')."""
    jobs: dict[str, AllocInfo] = {}
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3 and parts[0].strip().isdigit():
            job_id = parts[0].strip()
            jobs[job_id] = answer(job_id, parts[1], name=name, command=parts[2].strip())
    return jobs


def restart_count(job_id: str) -> int | None:
    """How often SLURM has requeued the job (`scontrol requeue`, a preemption or node failure that
    requeues): squeue's RestartCnt, which grows as the requeue begins, while the job's tasks are
    still being ended. None when SLURM cannot say."""
    try:
        return parse_restart_count(_run(["squeue", "--noheader", f"--jobs={job_id}", "--Format=RestartCnt"]))
    except SchedulerError:
        return None


def parse_restart_count(text: str) -> int | None:
    """`squeue --noheader --Format=RestartCnt` -> the count (None when squeue listed no job)."""
    word = text.strip()
    return int(word) if word.isdigit() else None


# Node states (sinfo %T) in which a node runs jobs, or will once the jobs on it end; the others
# (down, drained, draining, fail, maint, ...) and any not responding ('*') wait for an admin.
RUNS_JOBS = {"idle", "mixed", "allocated", "completing", "planned"}


def parse_sinfo_out(text: str, partition: str | None) -> tuple[int, dict[str, str]]:
    """`sinfo --noheader --Node --format=%N|%P|%T|%E` -> how many of `partition`'s nodes (the
    default one's when None) can run jobs now, and the others: node -> 'drained (maintenance)'."""
    usable, out = 0, {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|", 3)]
        if len(parts) != 4 or not parts[0]:
            continue
        node, part, state, reason = parts
        if part.removesuffix("*") != partition and not (partition is None and part.endswith("*")):
            continue
        if state in RUNS_JOBS:
            usable += 1
        else:
            out[node] = state + (f" ({reason})" if reason and reason != "none" else "")
    return usable, out


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
def parse_cpus_per_node(value: str) -> list[int]:
    """SLURM_JOB_CPUS_PER_NODE, e.g. '16(x3),8' -> [16, 16, 16, 8]."""
    counts: list[int] = []
    for part in filter(None, value.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"cannot read SLURM_JOB_CPUS_PER_NODE={value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


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
