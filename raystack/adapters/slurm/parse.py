"""What SLURM's commands print, read: pure parsers of `sbatch --parsable`, `squeue`'s and `sinfo`'s
fixed formats and `sacct --parsable2`, each tested against outputs recorded on the testbed; and
SLURM's job states in the allocator's words."""

from __future__ import annotations

import re
import time
from typing import Any

from raystack import durations
from raystack.adapters.allocator import (
    AllocInfo,
    AllocState,
    NodeShape,
)
from raystack.errors import (
    NoSuchPartition,
    SchedulerError,
)

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
        partition_words = f"partition '{partition}'" if partition else "the default partition"
        raise SchedulerError(f"sinfo lists no nodes in {partition_words}; name one with --partition")
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


def parse_cpus_per_node(value: str) -> list[int]:
    """SLURM_JOB_CPUS_PER_NODE, e.g. '16(x3),8' -> [16, 16, 16, 8]."""
    counts: list[int] = []
    for part in filter(None, value.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"cannot read SLURM_JOB_CPUS_PER_NODE={value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
