"""A worker node's program: join the head of this allocation, stay while it lives.

A worker leaves at once when the head records that the cluster ended, and otherwise only after
the head has been unreachable for `head_grace` seconds (Ray's own GCS reconnect grace is 60 s):
a GCS restart or a short network blip must not end the whole cluster.
"""

from __future__ import annotations

import logging
import random
import time

from raystack.allocation.context import (
    GpuReport,
    NodeContext,
    Reaper,
    Stop,
    ray_env,
    ray_start_argv,
    stop_ray,
    wait_for,
)
from raystack.allocation.rayproc import RayProcess, node_ports, tcp_open
from raystack.allocation.usage import UsageSampler
from raystack.store import cluster as records
from raystack.store.cluster import ClusterRecord, ClusterState

log = logging.getLogger("raystack.node")
PROBE = 1.0  # seconds between probes of the head's GCS port
RECORD_EVERY = 5.0  # seconds between reads of the cluster record
TURN_POLL = 0.5  # seconds between reads of the record while waiting for a turn to join
STALL = 30.0  # seconds without a node joining after which a waiting worker joins anyway


def head_record(ctx: NodeContext) -> ClusterRecord | None:
    """The record once the head of *this* allocation has published its address."""
    if not records.exists(ctx.cluster):
        return None
    record = records.read(ctx.cluster)
    if record.slurm_job_id == ctx.job_id and (record.gcs_address or record.state.is_terminal()):
        return record
    return None


def head_ended(ctx: NodeContext) -> bool:
    """The head recorded the end of this allocation's cluster (or another allocation took over)."""
    record = records.read(ctx.cluster)
    return record.slurm_job_id != ctx.job_id or record.state.is_terminal()


def joining(ctx: NodeContext) -> bool:
    """The head of this allocation is still waiting for its nodes (not READY, not ended)."""
    record = records.read(ctx.cluster)
    return record.slurm_job_id == ctx.job_id and record.state is ClusterState.STARTING


def backoff(attempt: int) -> float:
    """Seconds before try `attempt` + 1: doubling from 1 s up to 16 s, jittered by up to -50% so
    that workers that failed together do not all return together."""
    return min(16.0, 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def wait_turn(ctx: NodeContext) -> None:
    """Join in waves (profile `join_window` W > 0): worker i starts its `ray start` once at most W
    workers before it are still registering, i.e. once the head counts i - W + 1 nodes (itself
    included). A wave that stalls for STALL seconds (a node that cannot join) no longer holds
    the ones behind it back."""
    if not ctx.join_window or ctx.node_id <= ctx.join_window:
        return
    need = ctx.node_id - ctx.join_window + 1
    last, since = -1, time.monotonic()
    while True:
        record = records.read(ctx.cluster)
        if record.nodes_joined >= need or head_ended(ctx):
            return
        if record.nodes_joined != last:
            last, since = record.nodes_joined, time.monotonic()
        elif time.monotonic() - since > STALL:
            log.warning("no node joined for %.0fs while waiting for a turn to join; joining now", STALL)
            return
        time.sleep(TURN_POLL)


def run_worker(ctx: NodeContext) -> int:
    record = wait_for(lambda: head_record(ctx), ctx.join_timeout, "the head to publish its address")
    if record.state.is_terminal() or not record.gcs_address:
        log.info("cluster %s is %s before this node joined; exiting", ctx.cluster, record.state.value)
        return 0
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
        return 0
    reap, report = Reaper(), GpuReport(ctx)
    sample = UsageSampler(ctx.cluster, ctx.job_id, ctx.host)

    def start() -> RayProcess:
        # Fresh ports on every try: the last try's processes may not have released theirs yet.
        ray = RayProcess(ray_start_argv(ctx, node_ports(head=False), record.gcs_address), ray_env(ctx))
        reap.owned.add(ray.proc.pid)
        return ray

    ray, attempt = start(), 1
    try:
        last_seen, last_read = time.monotonic(), time.monotonic()
        while True:
            if not ray.alive():
                if head_ended(ctx) or not tcp_open(head_ip, int(gcs_port)):
                    log.info("head %s is gone; leaving", record.gcs_address)
                    return 0
                # NOTE: a GCS swamped by many nodes registering at once makes `ray start` give
                # up after ~30 s ("The current node timed out during startup"): while the head
                # still waits for its nodes, try again rather than fail the whole cluster.
                delay = backoff(attempt)
                if not joining(ctx):  # (the head decides when the start has failed)
                    log.error("ray start exited with code %s while the head lives", ray.proc.returncode)
                    return 1
                log.warning(
                    "ray start exited with code %s (try %d) while the head waits for its nodes; "
                    "trying again in %.1fs",
                    ray.proc.returncode,
                    attempt,
                    delay,
                )
                ray.stop()  # (whatever that try left behind: its raylet may still be registering)
                reap.owned.discard(ray.proc.pid)
                time.sleep(delay)
                ray, attempt = start(), attempt + 1
                continue
            if tcp_open(head_ip, int(gcs_port)):
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen > ctx.head_grace:
                log.info("head %s unreachable for %.0fs; leaving", record.gcs_address, ctx.head_grace)
                return 0
            if time.monotonic() - last_read > RECORD_EVERY:
                last_read = time.monotonic()
                if head_ended(ctx):
                    log.info("the head recorded the cluster's end; leaving")
                    return 0
            report()
            reap()
            sample()
            time.sleep(PROBE)
    except Stop as stop:
        log.info("node %s stopping (%s)", ctx.host, stop)
        return 0
    finally:
        stop_ray(ctx, ray)
