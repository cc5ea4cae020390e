"""Stack dumps of a live job, asked through the cluster folder (`raystack stacks ID`, and the queue
runner before it stops a hung job).

    logs/stacks.request                {job id: time asked}: every node program looks at it every
                                       second (one stat) and dumps the Python stacks of that job's
                                       processes on its node (allocation/watchdog/stacks.py)
    logs/jobs/<id>/stacks/<host>-<pid>.txt   one process's dump (py-spy), with a header line
    logs/jobs/<id>/stacks/.done-<host>       the node's answer: {"asked": t, "count": n}
    logs/jobs/<id>/stacks/earlier/<host>-<pid>-<time>.txt   a dump a later request replaced (a
                                       manual `raystack stacks` before the watchdog's own)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from raystack.store import diagnosis, paths
from raystack.store.files import atomic_write, locked
from raystack.waiting import REAL, Clock, at_most

REQUEST = "stacks.request"
KEEP = 600.0  # seconds a request stays in the request file
DONE = ".done-"


def request_file(cluster: str) -> Path:
    return paths.cluster(cluster).logs / REQUEST


def folder(cluster: str, job_id: str) -> Path:
    return paths.cluster(cluster).job_files(job_id) / "stacks"


def requests(cluster: str) -> dict[str, float]:
    """The jobs whose stacks were asked for, with when (those of the last KEEP seconds)."""
    try:
        data = json.loads(request_file(cluster).read_text())
    except (OSError, ValueError):
        return {}
    return (
        {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}
        if isinstance(data, dict)
        else {}
    )


def request(cluster: str, job_id: str) -> float:
    """Ask every node of the cluster for the stacks of job `job_id`'s processes; the time asked."""
    p = paths.cluster(cluster)
    paths.validate_job_id(job_id)
    asked = time.time()
    with locked(p):
        pending = {k: v for k, v in requests(cluster).items() if asked - v < KEEP}
        pending[job_id] = asked
        atomic_write(request_file(cluster), json.dumps(pending))
    return asked


@dataclass
class Dumps:
    """What the nodes answered to one request."""

    folder: Path
    files: list[Path] = field(default_factory=list)  # one per process, <host>-<pid>.txt
    answered: list[str] = field(default_factory=list)  # hosts that answered
    late: list[str] = field(default_factory=list)  # hosts that did not within the time given
    summary: str = ""  # what they show (store/diagnosis.py): ranks, collectives, flight recorders
    kept: bool = False  # the dumps taken before an ended job was stopped (nothing asked now)


def keep_earlier(dump: Path) -> None:
    """Before a process's dump is written again: the one there goes to earlier/, named by when it
    was taken (nothing is overwritten: the stacks a user asked for outlive the watchdog's)."""
    try:
        taken = dump.stat().st_mtime
    except FileNotFoundError:
        return
    earlier = dump.parent / "earlier"
    earlier.mkdir(exist_ok=True, mode=0o700)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(taken)) + f".{int(taken * 1000) % 1000:03d}"
    os.replace(dump, earlier / f"{dump.stem}-{stamp}.txt")


def answer(cluster: str, job_id: str, host: str, asked: float, count: int) -> None:
    atomic_write(folder(cluster, job_id) / f"{DONE}{host}", json.dumps({"asked": asked, "count": count}))


def answered(cluster: str, job_id: str, asked: float) -> list[str]:
    """Hosts that answered the request made at `asked` (or a later one)."""
    found = []
    for path in folder(cluster, job_id).glob(f"{DONE}*"):
        try:
            if float(json.loads(path.read_text()).get("asked", 0)) >= asked - 1e-3:
                found.append(path.name.removeprefix(DONE))
        except (OSError, ValueError, AttributeError):
            continue
    return sorted(found)


def wait(
    cluster: str, job_id: str, asked: float, hosts: list[str], timeout: float, clock: Clock = REAL
) -> Dumps:
    """Wait (at most `timeout` s: a dead node never answers) until every host in `hosts` answered."""

    def look() -> tuple[list[str], list[str]]:
        done = answered(cluster, job_id, asked)
        return done, [h for h in hosts if h not in done]

    def all_answered() -> tuple[list[str], list[str]] | None:
        seen = look()
        return None if seen[1] else seen

    done, late = at_most(all_answered, 0.2, clock, timeout) or look()  # (after the timeout: who is late)
    dumps_dir = folder(cluster, job_id)
    files = (
        sorted(p for p in dumps_dir.glob("*.txt") if p.stat().st_mtime >= asked - 1)
        if dumps_dir.is_dir()
        else []
    )
    summary = diagnosis.diagnose(dumps_dir.parent, since=asked - 1)
    return Dumps(dumps_dir, files, done, late, summary)


def kept(cluster: str, job_id: str) -> Dumps:
    """The dumps in a job's folder as they are (an ended job's: taken before it was stopped)."""
    dumps_dir = folder(cluster, job_id)
    files = sorted(dumps_dir.glob("*.txt")) if dumps_dir.is_dir() else []
    hosts = (
        sorted(p.name.removeprefix(DONE) for p in dumps_dir.glob(f"{DONE}*")) if dumps_dir.is_dir() else []
    )
    return Dumps(dumps_dir, files, hosts, [], diagnosis.diagnose(dumps_dir.parent), kept=True)
