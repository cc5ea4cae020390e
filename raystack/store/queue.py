"""The persistent queue: one file per job not yet finished, ordered by name.

clusters/<name>/queue/<seq>-<id>.json   FIFO by name; --now jobs sort first
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from raystack.errors import ClusterError
from raystack.store import paths
from raystack.store.files import atomic_write, locked, make_private_dirs
from raystack.store.ledger import JobRecord, JobRequest, JobState, all_jobs, read_job, update_job, write_job


def queue_files(name: str) -> list[Path]:
    folder = paths.cluster(name).queue
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def job_id_of(path: Path) -> str:
    return path.stem.split("-", 1)[1]


def is_now(path: Path) -> bool:
    """--now jobs' queue files sort first: their sequence starts with 0 (see enqueue)."""
    return path.name.startswith("0")


def enqueue(request: JobRequest, now: bool = False) -> tuple[JobRecord, int]:
    """Write the ledger entry (QUEUED) and the queue file; return the record and its position."""
    name = request.cluster
    p = paths.cluster(name)
    make_private_dirs(p)
    record = JobRecord(
        id=request.id,
        name=request.name,
        request=request,
        history=[{"state": "QUEUED", "time": time.time(), "message": ""}],
    )
    with locked(p):
        write_job(name, record)
        # The file name orders the queue: --now jobs sort first (prefix 0), the rest by time.
        seq = f"{0 if now else 1}{time.time_ns():020d}"
        atomic_write(p.queue / f"{seq}-{request.id}.json", json.dumps({"id": request.id, "now": now}))
    return record, position(name, request.id)


def positions(name: str) -> dict[str, int]:
    """1-based place of every job not yet started, in queue order."""
    waiting = [job_id_of(p) for p in queue_files(name)]
    waiting = [j for j in waiting if read_job(name, j).state is JobState.QUEUED]
    return {job_id: i for i, job_id in enumerate(waiting, start=1)}


def position(name: str, job_id: str) -> int:
    """1-based place among jobs not yet started (0 once started or finished)."""
    return positions(name).get(job_id, 0)


def cancel(name: str, job_id: str) -> JobRecord:
    """Remove a job that has not started from the queue (CANCELLED)."""
    with locked(paths.cluster(name)):
        record = read_job(name, job_id)
        if record.state is not JobState.QUEUED or record.attempts:
            raise ClusterError(
                f"job {job_id} is {record.state.value}, not queued: "
                f"`raystack stop {job_id}` stops a running job"
            )
        for path in queue_files(name):
            if job_id_of(path) == job_id:
                path.unlink()
    return update_job(
        name, job_id, state=JobState.CANCELLED, message="cancelled before it started", ended=time.time()
    )


def interrupt_in_flight(name: str, reason: str) -> list[str]:
    """The allocation ended: jobs that were given to Ray and had not finished are FAILED.

    Queued jobs stay QUEUED (their files stay in the queue folder).
    """
    interrupted = []
    for record in all_jobs(name):
        if record.attempts and not record.state.is_terminal():
            update_job(
                name,
                record.id,
                state=JobState.FAILED,
                ended=time.time(),
                message=f"the allocation ended while the job was {record.state.value} ({reason})",
            )
            interrupted.append(record.id)
    return interrupted
