"""A worker node's program: join the head of this allocation, stay while it lives.

A worker leaves at once when the head records that the cluster ended, and otherwise only after
the head has been unreachable for `head_grace` seconds (Ray's own GCS reconnect grace is 60 s):
a GCS restart or a short network blip must not end the whole cluster.
"""

from __future__ import annotations

import logging
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
from raystack.store.cluster import ClusterRecord

log = logging.getLogger("raystack.node")
PROBE = 1.0  # seconds between probes of the head's GCS port
RECORD_EVERY = 5.0  # seconds between reads of the cluster record


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
    if head_ended(ctx):
        log.info("cluster %s ended before this node joined; exiting", ctx.cluster)
        return 0
    ray = RayProcess(ray_start_argv(ctx, node_ports(head=False), record.gcs_address), ray_env(ctx))
    reap, report = Reaper(), GpuReport(ctx)
    sample = UsageSampler(ctx.cluster, ctx.job_id, ctx.host)
    reap.owned.add(ray.proc.pid)
    try:
        last_seen, last_read = time.monotonic(), time.monotonic()
        while ray.alive():
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
        if head_ended(ctx) or not tcp_open(head_ip, int(gcs_port)):
            log.info("head %s is gone; leaving", record.gcs_address)
            return 0
        log.error("ray start exited with code %s while the head lives", ray.proc.returncode)
        return 1
    except Stop as stop:
        log.info("node %s stopping (%s)", ctx.host, stop)
        return 0
    finally:
        stop_ray(ctx, ray)
