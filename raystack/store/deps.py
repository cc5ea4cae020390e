"""Dependencies between jobs, in SLURM's words: a job queued `--after ID[:ok|:any|:notok]` waits
until ID (a job, or every job of a sweep) ended in the asked way, and is cancelled with the
reason once that can no longer happen: it never waits forever.

    ok     (afterok)     every one of them SUCCEEDED            (the default)
    any    (afterany)    every one of them ended, however
    notok  (afternotok)  every one of them FAILED, was STOPPED or CANCELLED
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from raystack.errors import ClusterError
from raystack.store import paths
from raystack.store.cluster import list_names
from raystack.store.ledger import JobRecord, JobState, read_job

NOT_OK = {JobState.FAILED, JobState.STOPPED, JobState.CANCELLED}
WORDS = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}
SWEEP_JOB = re.compile(r"[0-9a-f]{6}-\d+")  # a sweep job's id after its name: <6 hex>-<k>


@dataclass(frozen=True)
class Dependency:
    target: str  # a job id, or a sweep id (<name>-<hex>: every job <sweep>-<k>)
    when: str  # ok, any, notok

    def met_by(self, state: JobState) -> bool:
        if self.when == "ok":
            return state is JobState.SUCCEEDED
        if self.when == "notok":
            return state in NOT_OK
        return state.is_terminal()

    def __str__(self) -> str:
        return f"{WORDS[self.when]}:{self.target}"


def parse(item: str) -> Dependency:
    target, _, when = item.partition(":")
    return Dependency(target, when or "ok")


def job_ids(name: str) -> set[str]:
    """Every job id of the cluster's ledger (one directory listing)."""
    folder = paths.cluster(name).jobs
    return {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()


def members(target: str, ids: Iterable[str]) -> list[str]:
    """The jobs a dependency names: the job itself, or every job of the sweep <target>-<k>. (k is
    below MAX_SWEEP, never zero-padded: a job's own id, <name>-<8 hex>, whose hex digits happen
    to be all decimal, is not taken for the sweep <name>'s.)"""
    ids = set(ids)
    if target in ids:
        return [target]
    pattern = re.compile(re.escape(target) + r"-(0|[1-9]\d{0,6})")
    return sorted(i for i in ids if pattern.fullmatch(i))


def unknown(name: str, after: list[str], own: set[str], label: str = "--after") -> str | None:
    """Why `after` cannot be accepted at submit (an id that is no job or sweep of this cluster,
    one of the jobs being queued: a cycle, or one that has ended so that it can never be met, as
    afterok on a FAILED job), else None. `label` names where it was given."""
    if not after:
        return None
    ids = job_ids(name)
    for item in after:
        dep = parse(item)
        if dep.target in own or any(m in own for m in members(dep.target, own)):
            return f"{label} {item}: a job cannot wait for itself"
        if not members(dep.target, ids):
            found = named(dep.target, ids)
            hint = f"; {dep.target} is a name, its ids: {', '.join(found[:3])}" if found else ""
            hint += " (see raystack queue --all)"
            if elsewhere := holder(dep.target, name):
                hint = f": it is in cluster {elsewhere}, and a job waits only for jobs of its own cluster"
            return f"{label} {item}: no job or sweep {dep.target!r} in cluster {name}{hint}"
        if (judged := verdict(name, [item], ids=ids)).never:
            return f"{label} {item}: {judged.reason}; give {dep.target}:any to run after it however it ended"
    return None


def holder(target: str, besides: str) -> str | None:
    """Another cluster whose ledger has the job or sweep `target` (None: none has)."""
    return next((o for o in list_names() if o != besides and members(target, job_ids(o))), None)


def named(name: str, ids: Iterable[str]) -> list[str]:
    """The ids to give for jobs named `name` (a job's id is <name>-<8 hex>; a sweep's, named by
    its jobs <name>-<6 hex>-<k>, is <name>-<6 hex>), sorted."""
    found = set()
    for job_id in ids:
        rest = job_id.removeprefix(f"{name}-")
        if rest != job_id:
            found.add(job_id.rsplit("-", 1)[0] if SWEEP_JOB.fullmatch(rest) else job_id)
    return sorted(found)


@dataclass(frozen=True)
class Verdict:
    ready: bool
    never: bool
    reason: str


def verdict(
    name: str, after: list[str], read: Callable[[str, str], JobRecord] = read_job, ids: set[str] | None = None
) -> Verdict:
    """Whether a job with these dependencies may start now, must wait, or never can."""
    waiting = []
    ids = job_ids(name) if ids is None else ids
    for item in after:
        dep = parse(item)
        targets = members(dep.target, ids)
        if not targets:
            return Verdict(False, True, f"dependency {dep.target} is no job of the cluster ({dep})")
        for job_id in targets:
            try:
                state = read(name, job_id).state
            except ClusterError:
                waiting.append(f"{dep} (its ledger cannot be read now)")
                continue
            if state.is_terminal() and not dep.met_by(state):
                return Verdict(
                    False, True, f"dependency {job_id} ended {state.value}: {dep} can never be met"
                )
            if not state.is_terminal():
                waiting.append(f"{dep}" if len(targets) == 1 else f"{WORDS[dep.when]}:{job_id}")
    if waiting:
        return Verdict(
            False, False, f"waits for {', '.join(waiting[:3])}" + (" ..." if len(waiting) > 3 else "")
        )
    return Verdict(True, False, "")
