"""The queue runner on the head node: the cluster folder's queue fed to the Ray Jobs API.

The runner (`python -m raystack.allocation.runner NAME`, started and restarted by the head's node program)
runs queued jobs one after another: it submits the oldest job to the Jobs API with a submission
id derived from the raystack job id, follows it, keeps its log, and starts the next only after
it has ended AND its resources are free again. `--now` jobs skip the line. The submission id is
written to the ledger *before* the job is submitted, so a restarted runner follows a job that
is already in Ray instead of running it again (and Ray refuses a duplicate submission id).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from raystack.adapters import ray as rayapi
from raystack.adapters.ray import Dashboard
from raystack.errors import ClusterError, RayApiError
from raystack.spec.submission import submit_options
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.files import atomic_write, make_private_dirs
from raystack.store.ledger import JobRecord, JobState, read_job, update_job
from raystack.store.queue import is_now, job_id_of, queue_files

log = logging.getLogger("raystack.runner")
TICK = 0.1  # seconds between runner passes
LOG_SYNC = 1.0  # seconds between log copies of a running job
FREE_TIMEOUT = float(os.environ.get("RAYSTACK_FREE_TIMEOUT", "600"))

# Ray's JobStatus values -> ours (one table; anything unknown stays SUBMITTED).
RAY_STATES = {
    "PENDING": JobState.SUBMITTED,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "STOPPED": JobState.STOPPED,
}


def gpu_memory_held(name: str, since: float) -> list[str] | None:
    """GPU memory still held on any node by leftover processes of the cluster's jobs.

    Each node program reports, where nvidia-smi exists, the processes among its descendants
    that hold GPU memory (vLLM is known to leave some behind). Only reports taken after `since`
    (the job's end) count: None means some GPU node has not reported since, so wait.
    """
    held = []
    for host, entry in records.read_node_entries(name).items():
        if "gpu_checked" not in entry:
            continue  # no nvidia-smi on that node: no real GPUs to check
        if float(entry["gpu_checked"]) < since:
            return None
        held += [f"{host} pid {pid} ({mib} MiB)" for pid, mib in entry.get("gpu_procs", [])]
    return held


# ---------------------------------------------------------------------------- runner
@dataclass
class Drain:
    """After a job ends: wait until its actors, placement groups and GPUs are released."""

    job_id: str
    ray_job_id: str | None
    deadline: float
    ended: float = field(default_factory=time.time)  # wall clock: GPU reports must be newer


class Runner:
    """Feeds the queue to the Jobs API, one job at a time (plus --now jobs at once)."""

    def __init__(self, name: str):
        self.name = name
        self.cluster = records.read(name)
        self.token = records.read_token(name)
        url = self.cluster.dashboard_url
        if not url:
            raise ClusterError(f"cluster {name} has no dashboard yet")
        self.url = url
        self.api = Dashboard(url, self.token)
        self.log_sync: dict[str, float] = {}
        self.stop_sent: set[str] = set()
        self.finished_logs: dict[str, str] = {}
        # After a restart we do not know whether the last job's resources were released: check.
        self.drain: Drain | None = Drain("(restart)", None, time.monotonic() + FREE_TIMEOUT)

    def run_forever(self) -> None:
        make_private_dirs(paths.cluster(self.name))
        log.info("queue runner for cluster %s started (pid %d)", self.name, os.getpid())
        while True:
            try:
                self.tick()
            except (RayApiError, OSError, RuntimeError) as exc:
                log.warning("runner pass failed, retrying: %s", exc)
                time.sleep(1)
            time.sleep(TICK)

    def tick(self) -> None:
        """One pass over the queue: follow jobs in flight, start what may start."""
        line_busy = False
        for path in queue_files(self.name):
            now = is_now(path)
            record = read_job(self.name, job_id_of(path))
            if record.state.is_terminal():
                path.unlink()
                continue
            if record.attempts:
                if self.follow(record, now):
                    path.unlink()
                elif not now:
                    line_busy = True
            elif now or not (line_busy or self.drain):
                record = self.start(record)
                self.submit(record, record.attempts[-1])
                line_busy = line_busy or not now
        if self.drain and self.resources_free(self.drain):
            log.info("resources of %s are free", self.drain.job_id)
            self.drain = None

    # ------------------------------------------------------------------ one job
    def start(self, record: JobRecord) -> JobRecord:
        """Give the job its next submission id; the next pass (or this one) submits it."""
        sid = record.id if not record.attempts else f"{record.id}-retry{len(record.attempts)}"
        # NOTE: the submission id is recorded before submitting: a runner killed in between
        # finds it on restart and asks Ray, instead of submitting the job a second time.
        return update_job(self.name, record.id, attempts=[*record.attempts, sid])

    def submit(self, record: JobRecord, sid: str) -> None:
        import requests

        cluster = records.read(self.name)
        log.info("submitting %s as %s", record.id, sid)
        try:
            self.api.submit(sid, **submit_options(record.request, cluster))
        except (requests.ConnectionError, requests.Timeout):
            raise  # transient: the next pass finds the id unknown to Ray and submits again
        except Exception as exc:
            if "already exists" not in str(exc):
                update_job(
                    self.name,
                    record.id,
                    state=JobState.FAILED,
                    ended=time.time(),
                    message=f"the Jobs API refused the job: {str(exc)[:400]}",
                )
                return
        update_job(self.name, record.id, state=JobState.SUBMITTED, message=f"submitted as {sid}")

    def follow(self, record: JobRecord, now: bool) -> bool:
        """Advance a job in flight; True once it is finished for good (ledger final)."""
        sid = record.attempts[-1]
        info = self.api.info(sid)
        if info is None:  # recorded but not in Ray yet: a retry, or the runner died in between
            if record.stop_requested:
                update_job(
                    self.name,
                    record.id,
                    state=JobState.STOPPED,
                    ended=time.time(),
                    message="stopped before it was submitted again",
                )
                return True
            if not self.drain or now:
                self.submit(record, sid)
            return False
        state = RAY_STATES.get(rayapi.ray_state(info), JobState.SUBMITTED)
        if state is JobState.RUNNING and record.state is not JobState.RUNNING:
            record = update_job(
                self.name,
                record.id,
                state=JobState.RUNNING,
                ray_job_id=info.job_id,
                started=(info.start_time or 0) / 1000 or time.time(),
                message=f"running as {sid}",
            )
        self.enforce_stop_and_timeout(record, sid)
        if not state.is_terminal():
            self.sync_log(record, sid)
            return False
        return self.finish(record, sid, state, info, now)

    def enforce_stop_and_timeout(self, record: JobRecord, sid: str) -> None:
        timeout = record.request.timeout
        overdue = (
            timeout is not None and record.started is not None and time.time() - record.started > timeout
        )
        if (record.stop_requested or overdue) and sid not in self.stop_sent:
            log.info("stopping %s (%s)", sid, "timeout" if overdue and not record.stop_requested else "stop")
            self.api.stop(sid)
            self.stop_sent.add(sid)

    def finish(self, record: JobRecord, sid: str, state: JobState, info: Any, now: bool) -> bool:
        self.sync_log(record, sid, final=True)
        timeout = record.request.timeout
        timed_out = state is JobState.STOPPED and not record.stop_requested and timeout is not None
        if (
            state is JobState.FAILED
            and len(record.attempts) <= record.request.retries
            and not record.stop_requested
        ):
            update_job(
                self.name,
                record.id,
                message=f"attempt {len(record.attempts)} failed, retrying: {info.message}",
            )
            self.drain = Drain(record.id, info.job_id, time.monotonic() + FREE_TIMEOUT)
            self.start(read_job(self.name, record.id))  # submitted once the resources are free
            return False
        if timed_out:
            state, message = JobState.FAILED, f"timed out after {timeout:g}s and was stopped"
        else:
            message = str(info.message or "")[:1000]
        update_job(
            self.name,
            record.id,
            state=state,
            message=message,
            exit_code=info.driver_exit_code,
            ray_job_id=info.job_id,
            started=record.started or (info.start_time or 0) / 1000 or None,
            ended=(info.end_time or 0) / 1000 or time.time(),
            at=(info.end_time or 0) / 1000 or time.time(),
        )
        log.info("%s %s: %s", record.id, state.value, message)
        for attempt in record.attempts:  # its log is on disk now; keep the runner's memory flat
            self.finished_logs.pop(attempt, None)
            self.log_sync.pop(attempt, None)
        if not now:
            self.drain = Drain(record.id, info.job_id, time.monotonic() + FREE_TIMEOUT)
        return True

    def sync_log(self, record: JobRecord, sid: str, final: bool = False) -> None:
        """Copy the job's log (every attempt, in order) into logs/jobs/<id>.log."""
        if not final and time.monotonic() - float(self.log_sync.get(sid, 0)) < LOG_SYNC:
            return
        self.log_sync[sid] = time.monotonic()
        parts = []
        for n, attempt in enumerate(record.attempts, start=1):
            if attempt not in self.finished_logs:
                text = self.api.logs(attempt)
                if attempt != sid or final:
                    self.finished_logs[attempt] = text
            else:
                text = self.finished_logs[attempt]
            header = f"--- raystack: attempt {n} ({attempt}) ---\n" if len(record.attempts) > 1 else ""
            parts.append(header + text)
        path = paths.cluster(self.name).job_log(record.id)
        content = "".join(parts)
        if not path.exists() or path.stat().st_size != len(content.encode()):
            atomic_write(path, content)

    # ------------------------------------------------------------------ resources
    def resources_free(self, drain: Drain) -> bool:
        """No actor or placement group of the job left, every GPU available, no GPU memory held."""
        if time.monotonic() > drain.deadline:
            log.warning(
                "resources of %s not free after %.0fs; starting the next job anyway",
                drain.job_id,
                FREE_TIMEOUT,
            )
            return True
        try:
            if drain.ray_job_id and self.api.job_leftovers(drain.ray_job_id):
                return False
            available, total = rayapi.available_gpus(str(self.cluster.gcs_address))
            if available < total:
                return False
            held = gpu_memory_held(self.name, since=drain.ended)
            return held is not None and not held
        except RayApiError as exc:
            log.warning("cannot check resources: %s", exc)
            return False


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s [%(name)s] %(message)s"
    )
    if len(sys.argv) != 2:
        sys.exit("usage: python -m raystack.allocation.runner CLUSTER")
    Runner(sys.argv[1]).run_forever()


if __name__ == "__main__":
    main()
