"""A worker node's program: join the head of this allocation, stay while it lives.

A worker leaves at once when the head records that the cluster ended. It watches the head two
ways: the head's GCS port, and the head's heartbeat file (allocation/duties.Heartbeat). The
GCS alone unreachable for `head_grace` seconds (Ray's own GCS reconnect grace is 60 s) makes it
leave: a GCS restart or a short network blip must not end the cluster. A head whose node
program is gone (its heartbeat stopped and its GCS went with it: SIGKILL, the OOM killer) ends
the allocation: the worker settles the jobs in flight (they resume in the next allocation) and
cancels it, so Ray never holds the nodes until the walltime with nobody running the queue.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from raystack.allocation.node.context import POLL, NodeContext, Stop, wait_for
from raystack.allocation.node.duties import GpuReport, Reaper
from raystack.allocation.node.rayproc import RayProcess, node_ports, tcp_open
from raystack.allocation.node.raystart import ray_env, ray_start_argv, stop_ray
from raystack.allocation.node.usage import UsageSampler
from raystack.allocation.watchdog.progress import ProgressProbe
from raystack.allocation.watchdog.stacks import StackRequests
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import files, node_entries, paths
from raystack.store.cluster import ClusterRecord, ClusterState, EndKind, read_heartbeat
from raystack.waiting import REAL, Backoff, Clock, Every, Guarded, until
from raystack.walltime import end_allocation, ending

log = logging.getLogger("raystack.node")
PROBE = 1.0  # seconds between probes of the head's GCS port
RECORD_EVERY = 5.0  # seconds between reads of the cluster record and the head's heartbeat
TURN_POLL = 0.5  # seconds between reads of the record while waiting for a turn to join
STALL = 30.0  # seconds without a node joining after which a waiting worker joins anyway
BEAT_STALE = 20.0  # seconds of a silent heartbeat after which a head whose GCS is gone is lost
HEAD_HUNG = 300.0  # seconds of a silent heartbeat after which the head is lost even with its GCS up
GCS_GONE = 3.0  # seconds without an answer from the GCS port that count as "gone"
REJOINS = 3  # restarts of this node's Ray after the cluster is up, at most, per REJOIN_WINDOW
REJOIN_WINDOW = 600.0


def head_record(ctx: NodeContext, left: str | None = None) -> ClusterRecord | None:
    """The record once the head of *this* allocation has published its address (a grown node's:
    the cluster's head, another than the one at `left` that it served before; or the record that
    no longer counts on it)."""
    if not records.exists(ctx.cluster):
        return None
    record = records.read(ctx.cluster)
    if ctx.grown:
        if record.state.is_terminal() or not ctx.holds(record):
            return record
        return record if record.gcs_address and record.gcs_address != left else None
    if ctx.holds(record) and (record.gcs_address or record.state.is_terminal()):
        return record
    return None  # (another allocation's, or an earlier run's of this requeued one: wait for the head)


def head_ended(ctx: NodeContext) -> bool:
    """The head recorded the end of this allocation's cluster (or another allocation took over)."""
    record = records.read(ctx.cluster)
    return not ctx.holds(record) or record.state.is_terminal()


def joining(ctx: NodeContext) -> bool:
    """The head of this allocation is still waiting for its nodes (not READY, not ended)."""
    record = records.read(ctx.cluster)
    return ctx.holds(record) and record.state is ClusterState.STARTING


def backoff(attempt: int) -> float:
    """Seconds before try `attempt` + 1: doubling from 1 s up to 16 s, jittered by up to -50% so
    that workers that failed together do not all return together."""
    return Backoff(first=1.0, cap=16.0, attempt=attempt - 1).next()


def wait_turn(ctx: NodeContext, clock: Clock = REAL) -> None:
    """Join in waves (profile `join_window` W > 0): worker i starts its `ray start` once at most W
    workers before it are still registering, i.e. once the head counts i - W + 1 nodes (itself
    included). A wave that stalls for STALL seconds (a node that cannot join) no longer holds
    the ones behind it back."""
    if not ctx.join_window or ctx.node_id <= ctx.join_window:
        return
    need = ctx.node_id - ctx.join_window + 1
    last, since = -1, clock.now()

    def turn() -> bool | None:
        nonlocal last, since
        record = records.read(ctx.cluster)
        if record.nodes_joined >= need or head_ended(ctx):
            return True
        if record.nodes_joined != last:
            last, since = record.nodes_joined, clock.now()
        elif clock.now() - since > STALL:
            log.warning("no node joined for %.0fs while waiting for a turn to join; joining now", STALL)
            return True
        return None

    until(turn, TURN_POLL, clock)


class HeadWatch:
    """Whether the head still lives: its GCS port (every PROBE s) and its heartbeat and the record
    (every RECORD_EVERY s). Judged by this node's own clock only (no clock skew between nodes:
    a heartbeat counts when it changed, not by the time written in it)."""

    def __init__(
        self,
        ctx: NodeContext,
        gcs: str,
        clock: Clock = REAL,
        probe: Callable[[str, int], bool] = tcp_open,
        beat: Callable[[str], dict[str, Any] | None] = read_heartbeat,
        head: str | None = None,
    ):
        self.ctx, self.gcs, self.clock, self.probe, self.beat = ctx, gcs, clock, probe, beat
        self.head = head or ctx.alloc_id  # the allocation whose head beats (a grown node's: the cluster's)
        self.host, port = gcs.rsplit(":", 1)
        self.port = int(port)
        self.probe_gate, self.read_gate = Every(PROBE, clock), Every(RECORD_EVERY, clock)
        self.gcs_seen = self.beat_changed = clock.now()
        self.last_beat: dict[str, Any] | None = None

    def gcs_up(self) -> bool:
        return self.clock.now() - self.gcs_seen < GCS_GONE

    def __call__(self) -> tuple[str, str] | None:
        """None while the head lives; else (kind, why): `ended` (the head recorded the end: leave),
        `lost` (its node program is gone: end the allocation), `unreachable` (its GCS has not
        answered for head_grace seconds while its program beats: leave)."""
        now = self.clock.now()
        if self.probe_gate() and self.probe(self.host, self.port):
            self.gcs_seen = now
        if self.read_gate():
            with contextlib.suppress(OSError, RaystackError):  # (unreadable now: read again later)
                if head_ended(self.ctx):
                    return "ended", "the head recorded the cluster's end"
            beat = self.beat(self.ctx.cluster)
            if beat is not None and beat.get("allocation") == self.head and beat != self.last_beat:
                self.last_beat, self.beat_changed = beat, now
        silent, unanswered = now - self.beat_changed, now - self.gcs_seen
        if silent > BEAT_STALE and unanswered >= GCS_GONE:
            return "lost", (
                f"the head's node program has been silent for {silent:.0f}s and its GCS {self.gcs} "
                f"does not answer"
            )
        if silent > HEAD_HUNG:
            return "lost", f"the head's node program has been silent for {silent:.0f}s"
        if unanswered > self.ctx.head_grace:
            return "unreachable", f"head {self.gcs} unreachable for {self.ctx.head_grace:.0f}s"
        return None


def end_for_lost_head(ctx: NodeContext, why: str) -> None:
    """The head's node program is gone: settle the jobs in flight (they resume in the next
    allocation) and the record, then cancel the allocation (every worker may do it: the first
    settles, scancel is idempotent)."""
    log.error("%s: ending allocation %s", why, ctx.alloc_id)
    with contextlib.suppress(RaystackError, OSError):
        end_allocation(ctx.cluster, ctx.alloc_id, ending(EndKind.HEAD_LOST, why), ClusterState.FAILED)
    with contextlib.suppress(RaystackError):
        ctx.allocator.release(ctx.alloc_id)


class Worker:
    """The worker's life once the head has published its address: `ray start`, retried while the
    head waits for its nodes; then the node's duties until the head ends or is gone."""

    def __init__(
        self,
        ctx: NodeContext,
        record: ClusterRecord,
        clock: Clock = REAL,
        probe: Callable[[str, int], bool] = tcp_open,
        start_ray: Callable[[], RayProcess] | None = None,
    ):
        self.ctx, self.clock = ctx, clock
        self.gcs = str(record.gcs_address)
        self.reap = Reaper(clock=clock)
        self.watch = HeadWatch(ctx, self.gcs, clock, probe, head=ctx.head_allocation(record))
        self.start_ray = start_ray or self._start_ray
        progress = ProgressProbe(ctx.cluster, ctx.host, clock=clock)
        self.duties = [
            Guarded(name, duty, log, clock)
            for name, duty in (
                ("GPU report", GpuReport(ctx, clock=clock)),
                ("reaping", self.reap),
                (
                    "usage sample",
                    UsageSampler(ctx.cluster, ctx.alloc_id, ctx.host, clock=clock, progress=progress.rows),
                ),
                ("stack dumps", StackRequests(ctx.cluster, ctx.host, clock=clock)),
                ("progress", progress),
            )
        ]
        self.ray: RayProcess | None = None
        self.rejoined: list[float] = []  # when this node's Ray was started again after the cluster was up

    def _start_ray(self) -> RayProcess:
        # Fresh ports on every try: the last try's processes may not have released theirs yet.
        ports = node_ports(head=False)
        ray = RayProcess(ray_start_argv(self.ctx, ports, self.gcs), ray_env(self.ctx))
        # (the runner asks it whether this node still answers when a job with work here fails)
        self.ctx.entry["raylet_port"] = ports["node_manager"]
        with contextlib.suppress(OSError):
            node_entries.write_node_entry(self.ctx.cluster, self.ctx.host, self.ctx.entry)
        self.reap.owned.add(ray.proc.pid)
        return ray

    def run(self) -> int:
        tries = Backoff(first=1.0, cap=16.0)
        self.ray = self.start_ray()
        # (each duty and the head's watch keep their own pace)
        return until(lambda: self.one_pass(tries), POLL, self.clock)

    def one_pass(self, tries: Backoff) -> int | None:
        """Ray started again if it exited, the head watched, the duties run; the exit code once
        this node program leaves."""
        assert self.ray is not None
        if not self.ray.alive():
            return None if self.restart(tries) else 0
        verdict = self.watch()
        if verdict is not None:
            kind, why = verdict
            if kind == "lost" and not self.ctx.grown:
                end_for_lost_head(self.ctx, why)
            else:
                log.info("%s; leaving", why)
            return 0
        for duty in self.duties:
            duty()
        return None

    def restart(self, tries: Backoff) -> bool:
        """`ray start` exited. While the head still waits for its nodes, try again (NOTE: a GCS
        swamped by many nodes registering at once makes `ray start` give up after ~30 s: "The
        current node timed out during startup"). Once the cluster is up and its head lives, start
        it again and rejoin (the allocation still holds this node: a raylet killed by the OOM
        killer must not leave it idle until the walltime), up to REJOINS times per REJOIN_WINDOW.
        Whether to go on."""
        assert self.ray is not None
        code = self.ray.proc.returncode
        try:
            still_joining = joining(self.ctx)
        except (OSError, RaystackError):
            still_joining = False
        if still_joining:
            why = f"ray start exited with code {code} (try {tries.attempt + 1})"
            why += " while the head waits for its nodes"
        elif not self.watch.gcs_up():
            log.info("ray start exited with code %s; head %s is gone; leaving", code, self.gcs)
            return False
        else:
            now = self.clock.now()
            self.rejoined = [t for t in self.rejoined if now - t < REJOIN_WINDOW]
            if len(self.rejoined) >= REJOINS:
                log.error(
                    "Ray on this node exited (code %s) while the head lives, the %d time in %.0f s; leaving",
                    code,
                    REJOINS + 1,
                    REJOIN_WINDOW,
                )
                return False
            self.rejoined.append(now)
            why = f"Ray on this node exited (code {code}) while the head lives; it rejoins"
        delay = tries.next()
        log.warning("%s: trying again in %.1fs", why, delay)
        self.ray.stop()  # (whatever that try left behind: its raylet may still be registering)
        self.reap.owned.discard(self.ray.proc.pid)
        self.clock.sleep(delay)
        self.ray = self.start_ray()
        return True


def run_grown(ctx: NodeContext) -> int:
    """A grown allocation's node: a worker of whichever head runs the cluster. When that head's
    allocation ends and the chain goes on, it waits for the next head (join_timeout) and joins it."""
    left: str | None = None
    while True:
        record = wait_for(functools.partial(head_record, ctx, left), ctx.join_timeout, "the head")
        if record.state.is_terminal() or not ctx.holds(record) or not record.gcs_address:
            log.info(
                "cluster %s no longer counts on this node (%s); exiting", ctx.cluster, record.state.value
            )
            return 0
        left = record.gcs_address
        code, stopped = serve(ctx, record)
        if stopped or head_ended(ctx):
            return code
        log.info("the head of cluster %s is gone; waiting for the next one to join it", ctx.cluster)


def run_worker(ctx: NodeContext) -> int:
    record = wait_for(lambda: head_record(ctx), ctx.join_timeout, "the head to publish its address")
    if record.state.is_terminal() or not record.gcs_address:
        log.info("cluster %s is %s before this node joined; exiting", ctx.cluster, record.state.value)
        return 0
    return serve(ctx, record)[0]


def serve(ctx: NodeContext, record: ClusterRecord) -> tuple[int, bool]:
    """Join the head the record names and stay while it lives: (exit code, stopped by a signal)."""
    assert record.gcs_address
    check_shared_locks(ctx, ctx.head_allocation(record))
    head_ip, gcs_port = record.gcs_address.rsplit(":", 1)
    # NOTE: the head publishes its address before its GCS listens. A `ray start --address` that
    # finds no GCS blocks in a connect timeout and then sleeps 1 s per retry (ray 2.60,
    # Node._init_gcs_client), seconds lost: poll the port cheaply first.
    wait_for(
        lambda: tcp_open(head_ip, int(gcs_port), timeout=0.5) or head_ended(ctx),
        ctx.join_timeout,
        "the head's GCS to listen",
    )
    wait_turn(ctx)
    if head_ended(ctx):
        log.info("cluster %s ended before this node joined; exiting", ctx.cluster)
        return 0, False
    node = Worker(ctx, record)
    try:
        return node.run(), False
    except Stop as stop:
        log.info("node %s stopping (%s)", ctx.host, stop)
        return 0, True
    finally:
        if node.ray is not None:
            stop_ray(ctx, node.ray)


def check_shared_locks(ctx: NodeContext, head: str | None = None) -> None:
    """From a worker (another host than the head, which holds a lock on .lockprobe): where the
    head's lock is not seen here, locks are node-local and the cluster folder uses link locks."""
    p = paths.cluster(ctx.cluster)
    if files.lock_seen(p, head or ctx.alloc_id) is False and not files.uses_link_locks(p):
        log.warning("the head's flock on %s is not seen from %s: using link locks", p.lock_probe, ctx.host)
        files.use_link_locks(p, f"flock taken on the head is not seen from node {ctx.host}")
