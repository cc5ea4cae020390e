"""The head node's program: Ray head, readiness, the queue runner, and the allocation's end.

Node 0 claims the cluster's record for this allocation (refusing when another live allocation
of the same name holds it), starts the Ray head with freshly chosen ports, publishes its address
at once so workers start alongside it, marks the cluster READY once every node, GPU and CPU is
registered and the Jobs API answers, then supervises the queue runner until SLURM ends it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from raystack.adapters.ray import Dashboard
from raystack.allocation.elastic.autoscale import Autoscale
from raystack.allocation.elastic.idle import IdleWatch
from raystack.allocation.elastic.leaving import Leaving
from raystack.allocation.head import canary, prometheus
from raystack.allocation.head.claim import Displaced, claim, head_record_fields
from raystack.allocation.head.readiness import head_exited, missing_nodes, wait_ready
from raystack.allocation.head.tlsfront import TlsFront
from raystack.allocation.head.warmup import launch, overlaps
from raystack.allocation.node.context import (
    POLL,
    NodeContext,
    Stop,
    ignore_signals,
    node_log,
    wait_for,
)
from raystack.allocation.node.duties import FolderWatch, GpuReport, Heartbeat, Reaper
from raystack.allocation.node.logsync import session_logs
from raystack.allocation.node.rayproc import RayProcess, free_ports, hold_port, node_ports, tcp_open
from raystack.allocation.node.raystart import metrics_on, ray_env, ray_start_argv, stop_ray
from raystack.allocation.node.usage import UsageSampler
from raystack.allocation.runner.loop import FIRST_VAR, LEASE_HELD, RAY_LOGS_VAR
from raystack.allocation.watchdog.progress import ProgressProbe
from raystack.allocation.watchdog.stacks import StackRequests
from raystack.errors import RaystackError
from raystack.launch.process import die_with_parent
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterState, EndKind
from raystack.store.growth import prune
from raystack.store.queue import active
from raystack.store.recovery import settle_orphans
from raystack.waiting import REAL, Clock, Every, Guarded, poll_until, until
from raystack.walltime import (
    Ending,
    classify,
    end_allocation,
    ending,
    submit_follow_on,
)

log = logging.getLogger("raystack.node")
PROMETHEUS_START = 30.0  # seconds the head waits for its Prometheus to listen before READY
METRIC_PORTS = ("autoscaler_metrics", "dashboard_metrics")  # Ray's own counters, no auth
RUNNER_GRACE = 10.0  # seconds the queue runner gets to leave after SIGTERM at the end
PRUNE_EVERY = 3600.0  # seconds between checks of the cluster folder's size against its cap


# ---------------------------------------------------------------------------- claiming the name


# ---------------------------------------------------------------------------- the head's life
def run_head(ctx: NodeContext) -> int:
    """The head's whole life. It never dies of a surprise: an error it cannot go on with ends the
    allocation (scancel) with Ray stopped, and the jobs in flight resume in the next one."""
    try:
        follow_on = claim(ctx)
    except Displaced as exc:
        log.error("%s", exc)
        cancel_allocation(ctx)
        return 1
    except Exception as exc:  # (the shared filesystem, SLURM: nothing has started yet)
        log.error("could not claim cluster %s: %s", ctx.cluster, exc, exc_info=not isinstance(exc, OSError))
        cancel_allocation(ctx)
        return 1
    head: Head | None = None
    ready = False
    try:
        reason = (
            "found when SLURM ran the requeued allocation again"
            if ctx.restart
            else "found when the next allocation of the chain started"
            if follow_on
            else "found at the next start"
        )
        # (a requeued allocation's run starts with nothing of its own in flight: every job whose
        # last attempt names this allocation ran in an earlier run of it)
        current = None if ctx.restart else ctx.alloc_id
        for job_id in settle_orphans(ctx.cluster, current, reason, requeue=follow_on):
            log.warning(
                "job %s was in flight in an allocation that ended: %s",
                job_id,
                "resumes" if follow_on else "FAILED",
            )
        Guarded("folder cap", lambda: prune_log(ctx), log)()  # (an earlier allocation's growth)
        head = Head.start(ctx)
        head.until_ready()
        ready = True
        end = head.supervise()
    except Stop as stop:
        if head is not None:
            head.end(None, f"SIGTERM ({stop})")
        return 0
    except Exception as exc:
        if isinstance(exc, RaystackError | OSError):
            log.error("the head cannot go on: %s", exc)  # (said: a start that fails is never silent)
        else:
            log.exception("the head's node program failed")
        end = (
            ending(EndKind.CRASHED, f"the head's node program failed: {exc}")
            if ready
            else ending(EndKind.FAILED, str(exc))
        )
    try:
        if head is not None:
            head.end(end, end.text)
    finally:
        # An ended cluster must not hold its nodes until the walltime: the other nodes' tasks
        # would otherwise keep the allocation alive. (A local cluster ends with this program.)
        cancel_allocation(ctx)
    return 1 if end.kind in (EndKind.FAILED, EndKind.CRASHED) else 0


def prune_log(ctx: NodeContext) -> None:
    for gone in prune(ctx.cluster, ctx.alloc_id, ctx.folder_cap):
        log.warning("cluster folder over its cap (profile folder_cap): removed %s", gone)


def cancel_allocation(ctx: NodeContext) -> None:
    with contextlib.suppress(RaystackError):
        ctx.allocator.release(ctx.alloc_id)


class Head:
    """The head's duties while Ray lives: the queue runner, reaping, GPU reports; and its end."""

    def __init__(
        self,
        ctx: NodeContext,
        ray: RayProcess,
        held: list[socket.socket] | None = None,
        ports: dict[str, int] | None = None,
        clock: Clock = REAL,
    ):
        self.ctx, self.ray, self.clock = ctx, ray, clock
        self.ports = ports or {}
        self.runner: subprocess.Popen | None = None
        self.reap = Reaper(clock=clock)
        self.reap.owned.add(ray.proc.pid)
        self.report = GpuReport(ctx, clock=clock)
        self.beat = Guarded("heartbeat", Heartbeat(ctx, clock), log, clock, cap=5.0)
        self.warned = False  # the walltime warning was passed on
        self.warning_flag = paths.cluster(ctx.cluster).warning(ctx.alloc_id)  # left by the batch shell
        self.nodes = NodeWatch(ctx, clock=clock)
        self.folder = Guarded("folder watch", FolderWatch(ctx, ctx.folder_grace, clock=clock), log, clock)
        self.front: TlsFront | None = None  # HTTPS in front of the dashboard (TLS clusters)
        self.held = held or []  # ports kept closed to Ray while it runs (rayproc.hold_port)
        self.prometheus: prometheus.Prometheus | None = None
        self.prometheus_exe: str | None = None
        self.progress = ProgressProbe(ctx.cluster, ctx.host, clock=clock)
        self.sample = UsageSampler(
            ctx.cluster, ctx.alloc_id, ctx.host, clock=clock, progress=self.progress.rows
        )
        self.idle: IdleWatch | None = None  # from READY on
        self.runner_started, self.runner_backoff, self.restarts = 0.0, 0.5, 0
        self.prune = Every(PRUNE_EVERY, clock, first=False)

    @classmethod
    def start(cls, ctx: NodeContext) -> Head:
        """Choose the ports and start the Ray head (nothing else yet)."""
        ports = node_ports(head=True, tls=ctx.tls is not None)
        env = ray_env(ctx)
        env["AUTOSCALER_METRIC_PORT"] = str(ports["autoscaler_metrics"])
        env["DASHBOARD_METRIC_PORT"] = str(ports["dashboard_metrics"])
        held = [] if metrics_on() else [hold_port(ports[p]) for p in METRIC_PORTS]
        exe = prometheus.binary() if metrics_on() else None
        if exe:
            ports["prometheus"] = free_ports(1)[0]
            env["RAY_PROMETHEUS_HOST"] = f"http://127.0.0.1:{ports['prometheus']}"
        elif metrics_on():
            log.info("metrics on; no prometheus binary found (PATH, profile `prometheus:`): none started")
        head = cls(ctx, RayProcess(ray_start_argv(ctx, ports, None), env), held, ports)
        head.prometheus_exe = exe
        return head

    def until_ready(self) -> None:
        """Publish the address, wait for every node, GPU and the Jobs API: READY."""
        ctx, ports = self.ctx, self.ports
        self.beat()
        if ctx.tls is not None:
            self.front = TlsFront(ctx.ip, ports["dashboard"], ports["dashboard_http"], ctx.tls).start()
        # The ports are fixed before Ray starts, so the address is published at once and the
        # workers start alongside the head (their `ray start --address` waits for the GCS).
        fields = head_record_fields(ctx, ports)
        records.update(ctx.cluster, **fields)
        wait_for(lambda: tcp_open(ctx.ip, ports["gcs"]), 120, "the GCS to listen", self.ray)
        dashboard = Dashboard.of(ctx.cluster, str(fields["dashboard_url"]))  # (HTTPS front with TLS)
        warm = launch(
            ctx.cluster, dashboard.url, ctx.alloc_id, overlaps(ctx.num_nodes, ctx.gpus), nodes=ctx.num_nodes
        )
        with contextlib.suppress(OSError):  # (else the head's duties start it after READY)
            self.keep_runner()  # (it starts meanwhile and takes its first job once the record says READY)
        wait_ready(ctx, dashboard, self.ray, self.beat, self.clock)
        if self.prometheus_exe:  # (before READY: the dashboard's metrics answer from the start)
            self.start_prometheus(self.prometheus_exe, ports["prometheus"])
        found = canary.at_ready(ctx, self.beat)  # (an NCCL all-reduce over every GPU)
        warm.finish()
        records.update(
            ctx.cluster,
            state=ClusterState.READY,
            message=f"{ctx.num_nodes} nodes, {ctx.gpus * ctx.num_nodes} GPUs ready",
            canary=found,
        )
        log.info("cluster %s READY", ctx.cluster)
        records.note(ctx.cluster, ctx.alloc_id, ready=time.time())
        submit_follow_on(ctx.cluster, ctx.alloc_id)

    def dashboard(self) -> Dashboard | None:
        """The dashboard as the head reaches it (loopback on a TLS cluster), once published."""
        if self.nodes.dashboard is None:
            url = records.read(self.ctx.cluster).on_head_dashboard_url
            self.nodes.dashboard = Dashboard.of(self.ctx.cluster, url) if url else None
        return self.nodes.dashboard

    def start_prometheus(self, exe: str, port: int) -> None:
        """Prometheus on 127.0.0.1, scraping the nodes Ray's service-discovery file lists."""
        p = paths.cluster(self.ctx.cluster)
        folder = (self.ctx.temp_root or self.ctx.temp_dir) / "prometheus"
        self.prometheus = prometheus.Prometheus(exe, port, folder, p.prometheus_log(self.ctx.alloc_id))
        session = (self.ctx.temp_dir / "session_latest").resolve()
        self.reap.owned.add(self.prometheus.start(session).pid)
        running = self.prometheus
        try:
            poll_until(
                lambda: tcp_open("127.0.0.1", port),
                PROMETHEUS_START,
                "Prometheus to listen",
                self.clock,
                abort=lambda: None if running.alive() else "Prometheus exited",
            )
        except RaystackError as exc:  # (metrics are a help: the cluster goes on without them)
            log.warning("%s (its log: %s); the cluster goes on without it", exc, running.log_path)

    def start_runner(self) -> subprocess.Popen:
        """The queue runner, a child of this node program (so teardown ends it too). It dies with
        the node program even when that is SIGKILLed: a runner left behind would go on taking
        jobs off the queue for a cluster that has ended (SLURM kills the step's cgroup; a local
        cluster has none)."""
        p = paths.cluster(self.ctx.cluster)
        with open(p.runner_log, "a") as logfile:
            proc = subprocess.Popen(
                [sys.executable, "-m", "raystack.allocation.runner", self.ctx.cluster],
                env={
                    **ray_env(self.ctx),
                    RAY_LOGS_VAR: str(session_logs(self.ctx.temp_dir)),
                    FIRST_VAR: "1" if self.runner is None and not self.restarts else "0",
                },
                stdout=logfile,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        self.reap.owned.add(proc.pid)
        log.info("queue runner started (pid %d)", proc.pid)
        self.runner_started = self.clock.now()
        return proc

    def keep_runner(self) -> None:
        """Restart a queue runner that exited, with back-off (longer when another runner holds the
        lease: it will not go away soon)."""
        if self.runner is None:
            self.runner = self.start_runner()
            records.update(self.ctx.cluster, runner_pid=self.runner.pid)
            return
        if self.runner.poll() is None or self.clock.now() - self.runner_started < self.runner_backoff:
            return
        code = self.runner.returncode
        self.reap.owned.discard(self.runner.pid)
        self.restarts += 1
        log.warning("queue runner exited with code %s; restarting (%d)", code, self.restarts)
        floor = 10.0 if code == LEASE_HELD else 0.5
        long_run = self.clock.now() - self.runner_started > 60
        self.runner_backoff = floor if long_run else min(max(self.runner_backoff * 2, floor), 30)
        self.runner = self.start_runner()
        records.update(self.ctx.cluster, runner_pid=self.runner.pid, runner_restarts=self.restarts)

    def check_warning(self) -> None:
        if not self.warned and self.warning_flag.exists():
            self.warned = True
            self.interrupt(
                EndKind.WALLTIME, "walltime warning: the jobs in flight are stopped to resume later"
            )

    def watch_nodes(self) -> None:
        lost = self.nodes()
        if lost:
            self.lose_nodes(lost)
        elif self.nodes.reported and not self.nodes.missing_since:  # (a worker's Ray rejoined)
            back, self.nodes.reported = ", ".join(self.nodes.reported), []
            if records.read(self.ctx.cluster).ending is None:
                message = f"node back: {back}; all {self.ctx.num_nodes} nodes in Ray"
                log.info("%s", message)
                records.update(self.ctx.cluster, message=message)

    def check_idle(self) -> str | None:
        assert self.idle is not None
        why = self.idle()
        self.sample.extra["other_jobs"] = self.idle.other_jobs
        return why

    def supervise(self) -> Ending:
        """While Ray lives: keep the queue runner alive (restarting it with back-off), reap
        orphans, report GPU use, sample usage, beat, answer stack requests, watch for idleness.
        Each duty is guarded: a failure (a full quota, EIO, a busy State API) is logged and that
        duty backs off; only Ray's end (a crash), idle autostop or its folder gone ends the cluster;
        signals arrive as Stop."""
        self.idle = IdleWatch(self.ctx.cluster, self.ctx.idle_timeout, self.dashboard, clock=self.clock.now)
        duties = [
            Guarded(name, duty, log, self.clock)
            for name, duty in (
                ("queue runner", self.keep_runner),
                ("walltime warning", self.check_warning),
                ("node watch", self.watch_nodes),
                ("grown allocations leaving", Leaving(self.ctx.cluster, self.dashboard, ray_env(self.ctx))),
                ("growing for the queue", Autoscale(self.ctx.cluster, self.dashboard)),
                ("GPU report", self.report),
                ("reaping", self.reap),
                ("usage sample", self.sample),
                ("stack dumps", StackRequests(self.ctx.cluster, self.ctx.host, clock=self.clock)),
                ("progress", self.progress),
                ("folder cap", self.prune_folder),
            )
        ]
        idle = Guarded("idle check", self.check_idle, log, self.clock)

        def one_pass() -> tuple[EndKind, str] | None:
            """The duties run, the idle and folder checks; why the cluster ends, or None."""
            if not self.ray.alive():
                return (EndKind.CRASHED, "")
            self.beat()
            for duty in duties:
                duty()
            why = idle()
            if why:
                return (EndKind.IDLE, f"{why}: autostop")
            gone = self.folder()
            return (EndKind.FAILED, gone) if gone else None

        kind, why = until(one_pass, POLL, self.clock)
        if kind is not EndKind.CRASHED:
            return ending(kind, why)
        # Ray's head died under a running cluster (its GCS or raylet killed: the OOM killer, a node
        # fault): a crash, as the node program's own; the jobs in flight resume in the next one.
        return ending(
            EndKind.CRASHED, head_exited(self.ray.proc.returncode, node_log(self.ctx, self.ctx.host))
        )

    def prune_folder(self) -> None:
        """Keep the cluster folder under its cap (profile `folder_cap`): every PRUNE_EVERY s."""
        if self.prune():
            prune_log(self.ctx)

    def interrupt(self, why: EndKind, message: str) -> None:
        """Tell the runner (and its successors, through the record) to stop the jobs in flight
        and start nothing more: this allocation is about to end."""
        log.warning("%s", message)
        records.update(self.ctx.cluster, ending=why, message=message)
        if self.runner is not None and self.runner.poll() is None:
            os.kill(self.runner.pid, signal.SIGUSR1)

    def lose_nodes(self, lost: list[str]) -> None:
        """A node left Ray. With a follow-on allocation pending, this allocation ends early (the
        jobs in flight resume there, on healthy nodes); without one, it runs on, degraded."""
        record = records.read(self.ctx.cluster)
        names = ", ".join(lost)
        if not record.next_allocation_id:
            if record.ending is None and self.nodes.reported != lost:
                self.nodes.reported = lost
                records.update(self.ctx.cluster, message=f"node lost: {names}; running on without it")
            return
        if record.ending is not EndKind.NODE_LOST:
            self.interrupt(EndKind.NODE_LOST, f"node lost: {names}; ending this allocation for the next one")
            self.nodes.giving_up = self.clock.now()
        if not active(self.ctx.cluster) or self.clock.now() - self.nodes.giving_up > self.nodes.drain_limit:
            log.warning("jobs interrupted; cancelling allocation %s", self.ctx.alloc_id)
            self.ctx.allocator.cancel(self.ctx.alloc_id)  # SIGTERM follows: end() hands over to the follow-on

    def stop_runner(self) -> None:
        """SIGTERM the queue runner (it finishes its pass and leaves), SIGKILL after RUNNER_GRACE."""
        if self.runner is None or self.runner.poll() is not None:
            return
        self.runner.terminate()
        try:
            self.runner.wait(RUNNER_GRACE)
        except subprocess.TimeoutExpired:
            log.warning("queue runner did not leave within %.0fs of SIGTERM; killing it", RUNNER_GRACE)
            self.runner.kill()
            self.runner.wait()

    def end(self, known: Ending | None, signal_text: str) -> None:
        """The allocation ends. The order matters when SLURM's SIGKILL may cut it short: the
        runner goes first (it cannot overwrite what follows), then the jobs in flight are
        settled, then the cluster's state is recorded, and only then is Ray stopped (slow)."""
        ignore_signals()
        try:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self.stop_runner()
            try:
                record = records.read(self.ctx.cluster)
                end = known or self.requeued() or classify(record, self.ctx.alloc_id)
                state = (
                    ClusterState.FAILED
                    if end.kind in (EndKind.FAILED, EndKind.CRASHED)
                    else ClusterState.STOPPED
                )
                why = "" if signal_text == end.text else f" ({signal_text})"
                log.info("allocation %s ended: %s%s", self.ctx.alloc_id, end.text, why)
                record = end_allocation(self.ctx.cluster, self.ctx.alloc_id, end, state)
                log.info("cluster %s %s: %s", self.ctx.cluster, record.state.value, record.message)
            except Exception as exc:  # (the record stays as it is: a client settles it later)
                log.error("the cluster's end was not recorded: %s", exc)
            if self.front is not None:
                self.front.stop()
            if self.prometheus is not None:
                self.prometheus.stop()
        finally:
            stop_ray(self.ctx, self.ray)

    def requeued(self) -> Ending | None:
        """SLURM is requeuing this allocation (its restart count has grown past this run's): it
        runs again under its id, and the jobs in flight resume there."""
        count = self.ctx.allocator.restarts(self.ctx.alloc_id)
        if count is None or count <= self.ctx.restart:
            return None
        return ending(EndKind.REQUEUED, f"restart {count}: scontrol requeue, or a preemption that requeues")


class NodeWatch:
    """Counts the head's Ray nodes every few seconds; names the nodes lost for `grace` seconds."""

    def __init__(self, ctx: NodeContext, every: float = 5.0, grace: float = 30.0, clock: Clock = REAL):
        self.ctx, self.grace, self.clock = ctx, grace, clock
        self.gate = Every(every, clock)
        self.missing_since = 0.0
        self.giving_up = 0.0
        self.drain_limit = 300.0  # seconds the interrupted jobs get to stop before the allocation ends
        self.reported: list[str] = []  # the lost nodes last written into the record's message
        self.dashboard: Dashboard | None = None

    def __call__(self) -> list[str]:
        if not self.gate():
            return []
        record = records.read(self.ctx.cluster)
        url = record.on_head_dashboard_url
        if not url:
            return []
        self.dashboard = self.dashboard or Dashboard.of(self.ctx.cluster, url)
        try:
            missing = missing_nodes(self.ctx, self.dashboard.alive_nodes())
        except RaystackError:
            return []  # the State API is busy: not a lost node
        if not missing:
            self.missing_since = 0.0
            return []
        self.missing_since = self.missing_since or self.clock.now()
        return missing if self.clock.now() - self.missing_since >= self.grace else []
