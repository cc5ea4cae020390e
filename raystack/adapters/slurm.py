"""The one adapter to SLURM: every SLURM command raystack runs goes through `_run`.

Only machine-readable output is parsed (`sbatch --parsable`, `squeue --json`, `sacct
--parsable2`). Parsers are pure functions tested against outputs recorded on the testbed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from raystack.errors import SlurmError


class SlurmState(str, Enum):
    """SLURM's job states (base states, without flags), plus UNKNOWN for anything else."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    GONE = "GONE"  # known to have existed, no longer visible to squeue nor sacct
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, raw: str) -> SlurmState:
        """Map SLURM's text ("CANCELLED by 0", "RUNNING", ...) to a state; UNKNOWN otherwise."""
        word = raw.strip().split(" ")[0].upper() if raw else ""
        return _STATE_TABLE.get(word, cls.UNKNOWN)

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def is_active(self) -> bool:
        """The allocation holds (or may still get) its nodes."""
        return not self.is_terminal() and self is not SlurmState.UNKNOWN


_STATE_TABLE = {s.value: s for s in SlurmState} | {
    "OOM": SlurmState.OUT_OF_MEMORY,
    "CA": SlurmState.CANCELLED,
}
_TERMINAL = {
    SlurmState.COMPLETED,
    SlurmState.CANCELLED,
    SlurmState.FAILED,
    SlurmState.TIMEOUT,
    SlurmState.NODE_FAIL,
    SlurmState.PREEMPTED,
    SlurmState.BOOT_FAIL,
    SlurmState.DEADLINE,
    SlurmState.OUT_OF_MEMORY,
    SlurmState.GONE,
}


@dataclass(frozen=True)
class JobInfo:
    """What raystack needs to know about one SLURM job."""

    job_id: str
    state: SlurmState
    reason: str = ""
    name: str = ""
    nodes: str = ""  # SLURM's compressed node list, e.g. "node[1-4]"
    node_count: int = 0
    start_time: int = 0  # epoch seconds, 0 when unknown
    end_time: int = 0  # epoch seconds: expected end while running, actual end once finished
    time_limit_min: int = 0
    exit_code: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


# ---------------------------------------------------------------------------- command runner
def _run(argv: Sequence[str], *, timeout: float = 60, stdin: str | None = None) -> str:
    """Run one SLURM command; return stdout or raise SlurmError with its stderr."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(
            f"`{argv[0]}` is not on PATH: run raystack on a SLURM login node "
            "(or `module load slurm`), or start the local testbed with slurm/testbed/up"
        )
    try:
        proc = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {timeout:.0f}s") from exc
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().replace("\n", " ")
        raise SlurmError(f"`{' '.join(argv[:2])}` failed: {message or f'exit {proc.returncode}'}")
    return proc.stdout


# ---------------------------------------------------------------------------- parsers (pure)
_SBATCH_ID = re.compile(r"^(\d+)(?:;\S+)?$")


def parse_sbatch_parsable(out: str) -> str:
    """`sbatch --parsable` prints `jobid` or `jobid;cluster` on its last line."""
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    match = _SBATCH_ID.match(lines[-1]) if lines else None
    if not match:
        raise SlurmError(f"could not read a job id from sbatch output: {out.strip()!r}")
    return match.group(1)


def _number(value: Any) -> int:
    """SLURM >= 23.02 wraps numbers as {"set": bool, "infinite": bool, "number": n}."""
    if isinstance(value, dict):
        return int(value.get("number") or 0) if value.get("set", True) else 0
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _state_text(value: Any) -> str:
    """`job_state` is a string up to 23.02 and a list of state words after it."""
    if isinstance(value, list):
        return value[0] if value else ""
    return str(value or "")


def parse_squeue_json(text: str) -> dict[str, JobInfo]:
    """Parse `squeue --json` (SLURM 22.05 to 24.x) into JobInfo by job id."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"squeue --json printed invalid JSON: {exc}") from exc
    jobs: dict[str, JobInfo] = {}
    for job in data.get("jobs", []):
        job_id = str(_number(job.get("job_id")))
        exit_code = job.get("exit_code")
        jobs[job_id] = JobInfo(
            job_id=job_id,
            state=SlurmState.parse(_state_text(job.get("job_state"))),
            reason=str(job.get("state_reason") or ""),
            name=str(job.get("name") or ""),
            nodes=str(job.get("nodes") or ""),
            node_count=_number(job.get("node_count")),
            start_time=_number(job.get("start_time")),
            end_time=_number(job.get("end_time")),
            time_limit_min=_number(job.get("time_limit")),
            exit_code=json.dumps(exit_code) if isinstance(exit_code, dict) else str(exit_code or ""),
            extra={"partition": job.get("partition"), "batch_host": job.get("batch_host")},
        )
    return jobs


SACCT_FIELDS = ("JobIDRaw", "State", "JobName", "NodeList", "Start", "End", "ExitCode")


def parse_sacct(text: str) -> dict[str, JobInfo]:
    """Parse `sacct --parsable2 --noheader --format=<SACCT_FIELDS>` (allocation lines only)."""
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS) or "." in parts[0]:
            continue  # steps (123.batch, 123.0) are not allocations
        job_id, state, name, nodes, _start, _end, exit_code = parts
        jobs[job_id] = JobInfo(job_id, SlurmState.parse(state), name=name, nodes=nodes, exit_code=exit_code)
    return jobs


# ---------------------------------------------------------------------------- commands
def sbatch(options: Sequence[str], script: str) -> str:
    """Submit `script` (a path) with `options`; return the job id. SLURM's refusal is raised."""
    return parse_sbatch_parsable(_run(["sbatch", "--parsable", *options, script]))


def squeue(job_ids: Sequence[str] | None = None) -> dict[str, JobInfo]:
    """Jobs known to slurmctld, including recently finished ones (MinJobAge)."""
    # NOTE: SLURM 22.05 ignores -j together with --json, so filter here.
    jobs = parse_squeue_json(_run(["squeue", "--json"]))
    return {k: v for k, v in jobs.items() if job_ids is None or k in job_ids}


def job_info(job_id: str) -> JobInfo | None:
    """One job's info: squeue first, then sacct for jobs slurmctld has forgotten.

    Returns a GONE JobInfo when neither knows the job (no accounting and past MinJobAge), and
    None only when SLURM itself could not be asked (the error is not fatal to the caller).
    """
    try:
        found = squeue([job_id]).get(job_id)
    except SlurmError:
        found = None
    if found is not None:
        return found
    try:
        out = _run(
            [
                "sacct",
                "--parsable2",
                "--noheader",
                "-j",
                job_id,
                "--format=" + ",".join(SACCT_FIELDS),
            ]
        )
        return parse_sacct(out).get(job_id) or JobInfo(job_id, SlurmState.GONE)
    except SlurmError as exc:
        if "accounting storage is disabled" in str(exc):
            return JobInfo(job_id, SlurmState.GONE)
        return None


def scancel(job_id: str, *, signal: str | None = None) -> None:
    """Cancel a job (or send it a signal); cancelling a finished job is not an error."""
    argv = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), job_id]
    try:
        _run(argv)
    except SlurmError as exc:
        if "Invalid job id" not in str(exc) and "already completing" not in str(exc):
            raise


def hostnames(nodelist: str) -> list[str]:
    """Expand a SLURM node list ("node[1-3],gpu7") into host names, in SLURM's order."""
    return _run(["scontrol", "show", "hostnames", nodelist]).split()
