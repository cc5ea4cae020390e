"""The queue runner on the head node: the cluster folder's queue fed to the Ray Jobs API.

`python -m raystack.allocation.runner NAME`, started (and restarted) by the head's node program,
runs queued jobs one after another: it takes the oldest job off the queue, submits it with a
submission id derived from its raystack id, follows it, streams its log into the cluster folder,
and starts the next only after it has ended AND its resources are free again. `--now` jobs skip
the line. One runner per cluster holds the lease (runner.lease); a second one exits.

A pass costs O(what changed): the queue's journal is read from an offset, only jobs in flight
have their ledgers read, and the queue folder is listed in full only every RESCAN seconds.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raystack.adapters import ray as rayapi
from raystack.adapters import raywords
from raystack.adapters.ray import Dashboard
from raystack.allocation.runner import pipcheck
from raystack.allocation.runner.drain import FREE_TIMEOUT, Drain, check, nodes_free
from raystack.allocation.runner.endwatch import EndWatch
from raystack.allocation.runner.lease import Lease
from raystack.allocation.runner.logtail import Tails, gather
from raystack.allocation.runner.picker import Picker
from raystack.allocation.runner.prepare import Preparer
from raystack.allocation.runner.retry import evicted_outcome, lost, may_retry, still_dying
from raystack.allocation.runner.schedule import Board
from raystack.allocation.watchdog.verdict import Watchdog
from raystack.errors import AlreadyExists, ClusterError, ConfigError, RayApiError, RayUnreachable
from raystack.launch import NODE_TMP_ENV, ahead
from raystack.launch.launchers import shell_exit_words
from raystack.spec import workdir
from raystack.spec.submission import driver_entrypoint, pinned, run_dir, submit_options
from raystack.store import cluster as records
from raystack.store import paths, raylogs, recovery, workerlogs
from raystack.store import queue as store
from raystack.store.cluster import ClusterState
from raystack.store.diagnosis import flight_summary, read_flight
from raystack.store.files import make_private_dirs
from raystack.store.ledger import Attempt, JobRecord, JobState, Unreadable, read_job, update_job
from raystack.store.queue import Entry
from raystack.waiting import REAL, Clock, Every, Repeats, until, within

log = logging.getLogger("raystack.runner")
TICK = 0.1  # seconds between runner passes
FIRST_VAR = "RAYSTACK_RUNNER_FIRST"  # "1": the allocation's first queue runner (set by the head)
RESCAN = 30.0  # seconds between full listings of the queue folder (the journal covers the rest)
LEASE_HELD = 3  # exit code: another runner holds this cluster's queue
RAY_LOGS_VAR = "RAYSTACK_RAY_LOGS"  # the head's Ray logs folder, given by the node program
STOP_UNHEARD = 15.0  # seconds a job Ray keeps PENDING may ignore its stop before it is ended here
SUBMIT_TIMEOUT = 600.0  # seconds for packaging + upload (RAYSTACK_SUBMIT_TIMEOUT)
# Seconds between questions to Ray about a running job whose driver's exit wakes the runner
# (endwatch.py): asking every TICK took the head's cores (runner, dashboard, GCS) from the job.
STEADY = 1.0

# Ray's JobStatus values -> ours (one table; anything unknown stays SUBMITTED).
RAY_STATES = {
    "PENDING": JobState.SUBMITTED,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "STOPPED": JobState.STOPPED,
}


class Runner:
    """Feeds the queue to the Jobs API, one job at a time (plus --now jobs at once)."""

    def __init__(
        self,
        name: str,
        api: Any = None,
        allocation: str | None = None,
        resources_free: Callable[[Drain], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = REAL.sleep,
    ):
        self.name = name
        self.paths = paths.cluster(name)
        self.cluster = records.read(name)
        self.allocation = allocation or os.environ.get("RAYSTACK_ALLOCATION") or self.cluster.allocation_id
        self.api = api if api is not None else Dashboard.on_head(self.cluster)  # (the runner runs there)
        self.clock = clock
        self.submit_timeout = float(os.environ.get("RAYSTACK_SUBMIT_TIMEOUT") or SUBMIT_TIMEOUT)
        self.resources_free = resources_free or self._resources_free
        self.stop_sent: dict[str, float] = {}  # when each stop was sent (the runner's clock)
        self.waiting: list[Entry] = []
        self.active: set[str] = set()
        self.journal = store.JournalReader(name)
        self.rescan_at = -1.0
        self.node_drains: dict[str, tuple[Drain, list[str]]] = {}  # a packed job's nodes, releasing
        self.picker = Picker(name, self.api, self.allocation, self.cluster, clock)
        # Started again after a walltime warning of this allocation: keep interrupting.
        self.interrupting = self.cluster.ending is not None and self.cluster.allocation_id == self.allocation
        # After a restart we do not know whether the last job's resources were released: check.
        # The allocation's first runner has nothing before it (a chain's last allocation took its
        # Ray with it): its first job is not held back (it took a second on every new cluster).
        first = os.environ.get(FIRST_VAR) == "1"
        self.drain: Drain | None = None if first else Drain("(restart)", None, clock() + FREE_TIMEOUT)
        self.held: dict | None = None  # what the ended job in self.drain still holds, and until when
        self.timing = Clock(clock, sleep)  # (the clock of everything the runner waits on)
        self.watchdog = Watchdog(name, self.api, self.allocation, self.cluster.gcs_address, self.timing)
        self.sleep = sleep
        # On the head (the node program gave its Ray logs folder): a driver's exit wakes the loop.
        self.ends = EndWatch(live=bool(os.environ.get(RAY_LOGS_VAR)))
        self.tails = Tails(self.api, self.paths, self.ends, os.environ.get(RAY_LOGS_VAR))
        self.pause = self.ends.pause if self.ends.live and sleep is REAL.sleep else sleep
        self.leaving = False  # SIGTERM: finish this pass, then leave
        self.abandoned: set[str] = set()  # submissions that timed out: stopped if they ever arrive
        self.dying: dict[str, float] = {}  # Ray nodes that died under a job, until Ray says so
        # The job that waits first gets its environment ready meanwhile (RAYSTACK_PREPARE=0: not).
        prepare = os.environ.get("RAYSTACK_PREPARE") != "0"
        self.preparer = Preparer(name, self.api, self.timing) if prepare else None
        self.considered: Entry | None = None  # the waiting job last given to the preparer
        self.last_end: dict[str, Any] | None = None  # the times of the last end (the next job's gap)

    # ------------------------------------------------------------------ the loop
    def run_forever(self, lease: Lease | None = None) -> None:
        make_private_dirs(self.paths)
        log.info("queue runner for cluster %s started (pid %d)", self.name, os.getpid())
        for job_id in recovery.settle_orphans(self.name, self.allocation, "found by the queue runner"):
            log.warning("job %s was in flight in an allocation that ended: FAILED", job_id)
        for job_id in recovery.recover(self.name):
            log.warning("job %s was in neither the queue nor in flight: back in the queue", job_id)
        pipe = os.path.join(os.environ.get(NODE_TMP_ENV) or "", "runner.wake")  # (node-local)
        if NODE_TMP_ENV in os.environ and self.pause == self.ends.pause and self.ends.listen(pipe):
            with contextlib.suppress(OSError, ClusterError):  # (a wake-up is a shortcut only)
                records.update(self.name, runner_wake=pipe)  # (a submit on this machine pokes it)
        # Started while the head still warms the cluster up: its own first submit is paid meanwhile
        # (about a second; tried again until the Jobs API answers), and the first pass waits for READY.
        warm, warmed = Every(0.5, self.timing), [False]

        def ready() -> bool | None:
            if not warmed[0] and warm():
                warmed[0] = self.api.warm()
            return self.cluster_up()

        until(ready, 0.05, self.timing)
        repeats = Repeats(self.clock, log, "runner pass")

        def one_pass() -> bool | None:
            if self.leaving:
                return True
            failed = None
            try:
                self.tick()
                repeats.over()
            except (RayApiError, OSError, RuntimeError, ClusterError) as exc:
                repeats.failed(str(exc))
                failed = str(exc)
                self.sleep(1)
            if lease is not None:
                lease.beat(failed, self.held if self.drain else None)
            return None

        # (between passes: TICK, or less when a driver's exit wakes the pause)
        until(one_pass, TICK, Clock(self.clock, self.pause))
        log.info("queue runner leaving (SIGTERM); the jobs in flight are followed by the next one")

    def cluster_up(self) -> bool | None:
        """True once the cluster is READY (or no longer starting: the loop then sees its end)."""
        state = records.read(self.name).state
        return None if state in (ClusterState.SUBMITTED, ClusterState.STARTING) and not self.leaving else True

    def leave(self, *_: object) -> None:
        """SIGTERM (the head's teardown): finish the pass in progress, then exit."""
        self.leaving = True

    def refresh(self) -> None:
        """Bring the in-memory queue up to date: the journal's new lines, or a full rescan."""
        if self.clock() >= self.rescan_at:
            self.journal = store.JournalReader(self.name)  # its offset first: nothing is missed
            self.waiting = store.waiting(self.name)
            self.active = set(store.active(self.name))
            self.rescan_at = self.clock() + RESCAN
            return
        for op, name in self.journal.changes():
            entry = Entry.parse(name)
            if entry is None:
                continue
            i = bisect.bisect_left(self.waiting, entry)
            present = i < len(self.waiting) and self.waiting[i] == entry
            if op == "+" and not present:
                self.waiting.insert(i, entry)
            elif op == "-" and present:
                del self.waiting[i]

    def tick(self) -> None:
        """One pass: follow the jobs in flight, start what may start."""
        self.refresh()
        board = Board(alive=[])
        for job_id in sorted(self.active):
            try:
                record = read_job(self.name, job_id)
            except Unreadable as exc:  # (EIO, ESTALE, a torn copy: read again next pass)
                log.warning("%s", exc)
                board.whole = True
                continue
            except ClusterError as exc:
                log.warning("%s", exc)
                self.active.discard(job_id)
                (self.paths.active / job_id).unlink(missing_ok=True)
                continue
            if self.follow(record):
                self.active.discard(job_id)
            elif not record.now:
                nodes = record.attempts[-1].nodes if record.attempts else []
                if nodes:
                    board.held[job_id] = list(nodes)
                else:
                    board.whole = True
        self.release(board)
        if not self.interrupting and not still_dying(self.api, self.dying):
            self.start_what_may(board)
            self.prepare_next()
        for sid in list(self.abandoned):  # (a submit that timed out but went through after all)
            if self.api.info(sid) is not None:
                self.api.stop(sid)
                self.abandoned.discard(sid)

    def release(self, board: Board) -> None:
        """Resources of ended jobs that are free again; those that are not stay on the board."""
        if self.drain and self.resources_free(self.drain):
            log.info("resources of %s are free", self.drain.job_id)
            if self.last_end is not None and self.last_end["after"] == self.drain.job_id:
                self.last_end["free"] = time.time()
            self.drain = None
        board.whole = board.whole or self.drain is not None
        for job_id, (drain, nodes) in list(self.node_drains.items()):
            if nodes_free(self.api, drain, self.clock()):
                del self.node_drains[job_id]
            else:
                board.held.setdefault(job_id, nodes)

    def start_what_may(self, board: Board) -> None:
        """Start what the picker chooses (allocation/runner/picker.py): --now jobs at once, then what
        fits, in queue order."""
        for started in self.picker.pick(self.waiting, board):
            self.active.add(started.id)
            self.submit(started)

    def prepare_next(self) -> None:
        """Give the job that waits first (it could not start in this pass) to the preparer, once."""
        if self.preparer is None or not self.waiting or self.waiting[0] == self.considered:
            return
        if not self.preparer.busy():  # (else asked again once the preparation in progress is over)
            self.considered = self.waiting[0]
            self.preparer.consider(self.considered.job_id)

    def interrupt(self, *_: object) -> None:
        """The allocation is about to end (walltime warning, a lost node): stop the jobs in flight
        (SIGTERM, then SIGKILL after their stop_grace) so they can checkpoint, put them back at
        the head of the queue, and start nothing more here."""
        if not self.interrupting:
            log.warning("allocation %s is ending: interrupting the jobs in flight", self.allocation)
        self.interrupting = True

    # ------------------------------------------------------------------ one job
    def submit(self, record: JobRecord) -> None:
        """Submit the job's last attempt; a transient failure is retried on the next pass."""
        attempt = record.attempts[-1]
        cluster = records.read(self.name)
        resumes = record.interruptions
        request = (record.resume_request or record.request) if resumes else record.request
        log.info("submitting %s as %s%s", record.id, attempt.id, f" (resume {resumes})" if resumes else "")
        try:
            options = submit_options(request, cluster, resumes)
            if request.working_dir and "://" not in request.working_dir:  # (a FIFO since? it blocks Ray)
                workdir.check(Path(request.working_dir), request.excludes, f"job {record.id}")
        except ConfigError as exc:  # its plan does not fit this allocation, or its working_dir
            self.finish(record, JobState.FAILED, str(exc))
            return
        renv = request.runtime_env
        known = self.preparer is not None and pipcheck.key(renv or {}) in self.preparer.checked
        why = pipcheck.check(renv) if renv and not known else None  # (a prepared job's: checked then)
        if why:  # (no index reachable from the nodes: say so now, not after Ray's setup timeout)
            self.finish(record, JobState.FAILED, why)
            return
        if self.preparer is not None:
            self.preparer.start(record.id)
        nodes, ids = self.nodes_of(record)
        if nodes:
            options = pinned(options, nodes, ids)
        with contextlib.suppress(OSError):  # (torch writes its flight recorder dumps there)
            (self.paths.job_files(record.id) / "flight").mkdir(parents=True, exist_ok=True, mode=0o700)
        begun = time.time()
        try:
            if not within(self.submit_timeout, self.api.submit, attempt.id, **options):
                self.abandoned.add(attempt.id)
                self.finish(
                    record,
                    JobState.FAILED,
                    f"packaging and uploading its working_dir took over {self.submit_timeout:.0f}s "
                    "(a hung filesystem, or a file that blocks when read?); not submitted",
                )
                return
        except RayUnreachable:
            raise  # transient: the next pass finds the id unknown to Ray and submits again
        except AlreadyExists:
            if not self.is_ours(attempt.id, record):
                # NOTE: an id reused after its ledger was lost: never inherit the other job's state.
                sid = f"{record.id}-{secrets.token_hex(3)}"
                log.warning("submission id %s belongs to another job; using %s", attempt.id, sid)
                store.add_attempt(self.name, record.id, sid, self.allocation)
                return
        except Exception as exc:  # Ray's refusal, or what packaging the working_dir raised
            self.finish(record, JobState.FAILED, f"the Jobs API refused the job: {str(exc)[:400]}")
            return
        ahead.ask(attempt.id, options["entrypoint"], options)  # (an SPMD job's launchers start now)
        ran = options["entrypoint"].removeprefix(driver_entrypoint("", run_dir(request)))
        message = f"submitted as {attempt.id}"
        if request.planned is not None and ran != request.planned:  # (a node lost since: fewer GPUs)
            message += f"; its plan changed with the cluster since it was queued: {ran}"
            log.warning("job %s: %s", record.id, message)
        changes = self.gap(record, begun)
        update_job(
            self.name, record.id, {"entrypoint": ran}, state=JobState.SUBMITTED, message=message, **changes
        )

    def gap(self, record: JobRecord, begun: float) -> dict[str, Any]:
        """The times from the last job's end to this submit, for a job that waited meanwhile."""
        gap = self.last_end
        if gap is None or record.now or record.request.queued_at > gap["ended"]:
            return {}
        self.last_end = None
        return {"gap": {**gap, "submit": begun, "submitted": time.time()}}

    def nodes_of(self, record: JobRecord) -> tuple[list[str], list[str]]:
        """A packed job's nodes (addresses, Ray node ids); a retry keeps those of its attempt."""
        for attempt in reversed(record.attempts):
            if attempt.nodes:
                return list(attempt.nodes), list(attempt.node_ids)
            if attempt.allocation == self.allocation and not attempt.id.startswith(f"{record.id}-retry"):
                break
        return [], []

    def is_ours(self, sid: str, record: JobRecord) -> bool:
        info = self.api.info(sid)
        metadata = (info.metadata or {}) if info is not None else {}
        return bool(metadata.get("raystack_nonce") == record.request.nonce)

    def follow(self, record: JobRecord) -> bool:
        """Advance a job in flight; True once it is finished for good (ledger final)."""
        if record.state.is_terminal():
            store.finish(self.name, record.id)
            return True
        if not record.state.known:
            log.warning("job %s is %s (another raystack version?): not followed", record.id, record.state)
            return True
        if record.state in (JobState.QUEUED, JobState.INTERRUPTED) and self.waits(record):
            return True  # a start or requeue cut short: the queue has it, `start` clears the marker
        attempt = record.attempts[-1] if record.attempts else None
        if attempt is None:  # an active marker without an attempt: never submitted
            self.finish(record, JobState.FAILED, "lost before it was submitted")
            return True
        if attempt.allocation != self.allocation:
            recovery.settle_orphans(self.name, self.allocation, "found by the queue runner")
            return True
        quiet = record.state is JobState.RUNNING and not (record.stop_requested or self.interrupting)
        if quiet and self.ends.quiet(attempt.id, self.clock(), STEADY):
            return False  # (Ray asked less than STEADY s ago; its driver's exit wakes the runner)
        info = self.api.info(attempt.id)
        seen = time.time()
        if info is None:  # recorded but not in Ray yet: a retry, or the runner died in between
            if self.interrupting and not record.stop_requested:
                recovery.requeue(self.name, record.id, self.interrupted_message())
                return True
            if record.stop_requested:
                self.finish(record, JobState.STOPPED, "stopped before it was submitted")
                return True
            nodes, _ = self.nodes_of(record)
            if record.now or (record.id not in self.node_drains if nodes else not self.drain):
                self.submit(record)
            return False
        state = RAY_STATES.get(rayapi.ray_state(info), JobState.SUBMITTED)
        if state is JobState.RUNNING and record.state is not JobState.RUNNING:
            record = update_job(
                self.name,
                record.id,
                state=JobState.RUNNING,
                ray_job_id=info.job_id,
                attempts=with_ray_id(record, info.job_id),
                started=(info.start_time or 0) / 1000 or time.time(),
                message=f"running as {attempt.id}",
            )
        if state is not JobState.SUBMITTED:
            self.tails.follow(record)
        if not state.is_terminal() and not record.fault and not record.stop_requested:
            fault = self.watchdog.check(record, info, running=state is JobState.RUNNING)
            if fault:
                record = self.watchdog.fault(record, attempt.id, fault)
        self.enforce_stop_and_timeout(record, attempt.id)
        if state is JobState.SUBMITTED and self.clock() - self.stop_sent.get(attempt.id, 1e18) > STOP_UNHEARD:
            return self.never_started(record, attempt.id)
        if not state.is_terminal():
            return False
        self.watchdog.forget(attempt.id)
        self.ends.forget(attempt.id)
        return self.put_back(record, state, attempt.id, info.job_id) or self.ended(record, state, info, seen)

    def put_back(self, record: JobRecord, state: JobState, sid: str, ray_job: str | None) -> bool:
        """An attempt stopped because the allocation ends, or its nodes leave the cluster (`raystack
        shrink`, or lost with them): back at the head of the queue (FAILED where the nodes left can
        never hold it). Its log is completed first (whether a node died under it may say so)."""
        self.tails.close(record, sid)
        if state is JobState.FAILED and not (record.evicted or record.stop_requested or self.interrupting):
            record = lost(self.name, self.api, record, ray_job, self.dying)
        if state is JobState.SUCCEEDED or record.stop_requested or not (self.interrupting or record.evicted):
            return False
        if self.interrupting:
            recovery.requeue(self.name, record.id, self.interrupted_message())
            log.info("%s INTERRUPTED: back at the head of the queue", record.id)
        elif outcome := evicted_outcome(self.name, record):
            self.finish(record, *outcome)
        return True

    def waits(self, record: JobRecord) -> bool:
        """The job is in the queue (its file is there) and its current start was not recorded."""
        sid = f"{record.id}-r{record.interruptions}" if record.interruptions else record.id
        started = bool(record.attempts) and record.attempts[-1].id == sid
        return bool(record.entry) and (self.paths.queue / str(record.entry)).exists() and not started

    def interrupted_message(self) -> str:
        why = records.read(self.name).ending or "the allocation is ending"
        return f"stopped in allocation {self.allocation} ({why}); it resumes in the next allocation"

    def enforce_stop_and_timeout(self, record: JobRecord, sid: str) -> None:
        timeout = record.request.timeout
        overdue = (
            timeout is not None and record.started is not None and time.time() - record.started > timeout
        )
        wanted = record.stop_requested or overdue or self.interrupting or record.fault or record.evicted
        if wanted and sid not in self.stop_sent:
            if record.fault and not record.stop_requested and self.watchdog.stacks_pending(sid, record.id):
                return
            why = (
                "stop"
                if record.stop_requested
                else "timeout"
                if overdue
                else record.fault.split(":")[0]
                if record.fault
                else "the allocation is ending"
                if self.interrupting
                else f"its nodes leave: {record.evicted}"
            )
            log.info("stopping %s (%s)", sid, why)
            self.api.stop(sid)
            self.stop_sent[sid] = self.clock()

    def never_started(self, record: JobRecord, sid: str) -> bool:
        """A stop sent to a job Ray still keeps PENDING (its driver never got its resources) is
        not heard: Ray queues it for a job supervisor that may never start (and fails the job
        only after its own start timeout, 15 min). Nothing of it runs: end it here, so it holds
        the queue no longer (Ray stops it if it ever starts)."""
        self.watchdog.forget(sid)
        del self.stop_sent[sid]
        if self.interrupting and not record.stop_requested:
            recovery.requeue(self.name, record.id, self.interrupted_message())
        elif record.stop_requested:
            self.finish(record, JobState.STOPPED, "stopped before it started")
        else:
            self.finish(record, JobState.FAILED, record.fault or "stopped before it started")
        return True

    def ended(self, record: JobRecord, state: JobState, info: Any, seen: float | None = None) -> bool:
        """The attempt ended in Ray (the runner saw it at `seen`): retry it, or record the job's
        final state."""
        nodes, _ = self.nodes_of(record)
        end = (info.end_time or 0) / 1000 or time.time()
        if nodes:  # (a packed job: its nodes, once its actors are gone)
            self.node_drains[record.id] = (Drain(record.id, info.job_id, self.clock() + FREE_TIMEOUT), nodes)
        elif not record.now:
            self.drain = Drain(record.id, info.job_id, self.clock() + FREE_TIMEOUT)
            self.last_end = {"after": record.id, "ended": end, "seen": seen or time.time()}
        if may_retry(record, state, info):
            n = len(record.attempts)
            outcome = f"FAILED: {self.failure_text(record, info)}"[:500]
            update_job(
                self.name,
                record.id,
                message=f"attempt {n} failed, retry {n} of {record.request.retries}: {outcome[8:]}"[:1000],
                attempts=[*record.attempts[:-1], record.attempts[-1].model_copy(update={"outcome": outcome})],
            )
            # The retry is submitted by a later pass, once the resources are free: ahead of every
            # job of the queue (it stays the job in flight).
            store.add_attempt(self.name, record.id, f"{record.id}-retry{n}", self.allocation)
            return False
        timeout = record.request.timeout
        if record.fault and not record.stop_requested:
            state, message = JobState.FAILED, record.fault
        elif state is JobState.STOPPED and not record.stop_requested and timeout is not None:
            state, message = JobState.FAILED, f"timed out after {timeout:g}s and was stopped"
        elif state is JobState.FAILED and info.driver_exit_code is not None:
            message = self.failure_text(record, info)[:1000]
        else:
            message = raywords.job_message(str(info.message or ""))[:1000]
        attempts = with_ray_id(record, info.job_id)  # (recorded by finish, with the rest)
        record = record.model_copy(update={"attempts": attempts})
        error = None
        if state is JobState.FAILED:  # its message names the first error: gathered now
            error = self.gather(record, events=True)
        else:  # nothing waits for it: the next job starts meanwhile
            later = threading.Thread(target=self.gather, args=(record,), name=f"gather-{record.id}")
            later.daemon = True
            later.start()
        if error and not record.fault:  # (a stuck job's actors died because it was stopped)
            # (the driver's last line is often Ray's words for the same death: not twice)
            cause = message.split(":", 1)[0] if workerlogs.DIED.search(message) else message
            message = f"{error} ({cause})"[:1000]
        self.finish(
            record,
            state,
            message,
            attempts=attempts,
            actor_error=error,
            exit_code=info.driver_exit_code,
            ray_job_id=info.job_id,
            started=record.started or (info.start_time or 0) / 1000 or None,
            ended=end,
            at=end,
        )
        return True

    def failure_text(self, record: JobRecord, info: Any) -> str:
        """Why an attempt failed: its exit code and the last line of its own output (Ray's
        message is the start of the log; the end says more, e.g. which rank failed)."""
        if info.driver_exit_code is None:
            return raywords.job_message(str(info.message or ""))
        last = raylogs.last_line(self.paths.job_log(record.id, len(record.attempts)))
        hint = workdir.missing_hint(last, record.request.left_out)  # (a file the defaults left out)
        since = (info.start_time or 0) / 1000 or record.attempts[-1].at
        flight = flight_summary(read_flight(self.paths.job_files(record.id) / "flight", since))
        text = f"exit code {shell_exit_words(info.driver_exit_code)}: {last or 'it printed nothing'}{hint}"
        return f"{text}; {flight}" if flight else text  # (torch's NCCL watchdog timed a collective out)

    def gather(self, record: JobRecord, events: bool = False) -> str | None:
        return gather(self.name, self.allocation or "", self.api, record, events)

    def finish(self, record: JobRecord, state: JobState, message: str, **changes: Any) -> None:
        changes.setdefault("ended", time.time())
        store.finish(self.name, record.id, state=state, message=message, **changes)
        log.info("%s %s: %s", record.id, state.value, message)
        if self.last_end is not None and self.last_end["after"] == record.id:
            self.last_end["closed"] = time.time()  # (its log complete, its ledger written)

    # ------------------------------------------------------------------ resources
    def _resources_free(self, drain: Drain) -> bool:
        """drain.check: what is still held is kept in `held` (the lease shows it to `raystack status`)."""
        free, self.held = check(self.api, drain, str(self.cluster.gcs_address), self.name, self.clock())
        return free


def with_ray_id(record: JobRecord, ray_job_id: str | None) -> list[Attempt]:
    """The job's attempts, the last one knowing its Ray job id."""
    last = record.attempts[-1].model_copy(update={"ray_job_id": ray_job_id or record.attempts[-1].ray_job_id})
    return [*record.attempts[:-1], last]


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s [%(name)s] %(message)s"
    )
    if len(sys.argv) != 2:
        sys.exit("usage: python -m raystack.allocation.runner CLUSTER")
    name = sys.argv[1]
    lease = Lease(paths.cluster(name))
    holder = lease.acquire()
    if holder is not None:
        log.error("another queue runner holds cluster %s (%s); exiting", name, holder)
        sys.exit(LEASE_HELD)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # (a line per request otherwise)
    runner = Runner(name)
    signal.signal(signal.SIGUSR1, runner.interrupt)  # sent by the head at the walltime warning
    signal.signal(signal.SIGTERM, runner.leave)  # sent by the head at its end (SIGKILL follows)
    runner.run_forever(lease)
