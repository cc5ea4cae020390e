"""The per-node program inside an allocation: `srun --ntasks-per-node=1 python -m raystack.allocation.node`.

Node 0 (SLURM_NODEID=0) runs the head (allocation/head/program.py), the others join it as workers
(allocation/node/worker.py). Every node stops only its own Ray processes (never a global `ray stop`,
which would kill other clusters sharing the node).

Configuration comes from the environment the allocation script exports:
RAYSTACK_HOME, RAYSTACK_CLUSTER, RAYSTACK_LOCAL_SCRATCH, RAYSTACK_OBJECT_STORE_MEMORY,
RAYSTACK_JOIN_TIMEOUT, RAYSTACK_HEAD_GRACE, RAYSTACK_FOLDER_GRACE, RAYSTACK_RAY_LOGS, plus SLURM's own
variables.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time

from raystack.allocation.head.program import run_head
from raystack.allocation.node.context import (
    NodeContext,
    Stop,
    context_from_env,
    node_certificate,
    on_signal,
    private_temp_dir,
)
from raystack.allocation.node.logsync import LogSync
from raystack.allocation.node.rayproc import become_subreaper
from raystack.allocation.node.worker import run_grown, run_worker
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import node_entries, paths
from raystack.store.files import hold_probe, make_private_dirs

log = logging.getLogger("raystack.node")


def setup_process() -> None:
    """Logging, umask, subreaper and signals of the node program's own process."""
    logging.basicConfig(
        level=os.environ.get("RAYSTACK_LOG_LEVEL", "INFO").upper(),
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
    )
    os.umask(0o077)  # whatever the allocation script or the user's shell had
    become_subreaper()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # (SIGHUP: a closed terminal, local)
        signal.signal(sig, on_signal)
    # NOTE: the walltime warning goes to the batch shell only (--signal=B:USR1), which leaves a
    # flag file for the head; a USR1 sent to the whole step by hand must not end the node.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def announce(ctx: NodeContext) -> None:
    """This node's entry in the cluster folder, and its first log line."""
    ctx.entry = {
        "ip": ctx.ip,
        "node_id": ctx.node_id,
        "pid": os.getpid(),
        "gpus": ctx.gpus,
        "cpus": ctx.cpus,
        "alloc_id": ctx.alloc_id,
        "started": time.time(),
    }
    node_entries.write_node_entry(ctx.cluster, ctx.host, ctx.entry)
    log.info(
        "allocation %s: node %s (%s) id %d of %d: %d GPUs, %d CPUs, cluster %s",
        *(ctx.alloc_id, ctx.host, ctx.ip, ctx.node_id, ctx.num_nodes, ctx.gpus, ctx.cpus, ctx.cluster),
    )


# What `raystack env OTHER` exports for Ray's clients. A shell that ran it hands them on to the
# allocation `raystack up` starts there (sbatch exports the environment; local mode inherits it):
# they name the other cluster (its address, its token), and Ray's clients in this program read
# them before the headers it is given, so this cluster's head never saw its node join. This
# cluster's own are set where they are needed (raystart.ray_env).
OTHER_CLUSTERS = (
    "RAY_ADDRESS",
    "RAY_API_SERVER_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_AUTH_TOKEN",
)


def joins(ctx: NodeContext) -> bool:
    """A grown allocation's node: its hosts and end written into the cluster's record (its first
    node does it), and whether the cluster still counts on it (`raystack grow` wrote its entry)."""
    fields: dict[str, object] = {}
    if ctx.node_id == 0:
        info = ctx.allocator.info(ctx.alloc_id)
        fields = {"hosts": ctx.allocator.hosts(ctx.alloc_id, ctx.nodelist or ctx.host)}
        if info is not None and info.end_time:
            fields["walltime_end"] = info.end_time
    entry = records.note_grown(ctx.cluster, ctx.alloc_id, **fields) if fields else None
    record = records.read(ctx.cluster)
    entry = entry or record.grown_entry(ctx.alloc_id)
    if entry is None or entry.released or record.state.is_terminal():
        log.info("cluster %s does not count on allocation %s (any more): leaving", ctx.cluster, ctx.alloc_id)
        with contextlib.suppress(RaystackError):
            ctx.allocator.release(ctx.alloc_id)
        return False
    log.info("allocation %s grows cluster %s: this node joins it as a worker", ctx.alloc_id, ctx.cluster)
    return True


def main() -> None:
    for name in OTHER_CLUSTERS:
        os.environ.pop(name, None)
    setup_process()
    ctx = None
    try:
        ctx = private_temp_dir(context_from_env(dict(os.environ)))
        p = paths.cluster(ctx.cluster)
        make_private_dirs(p)
        records.ensure_token(ctx.cluster)
        # (the head holds it while it lives: a worker, or `up` on the login node, checks that it
        # sees the lock; where it does not, the folder uses link locks)
        probe = hold_probe(p, ctx.alloc_id) if ctx.is_head else None
        ctx = node_certificate(ctx, dict(os.environ))
        announce(ctx)
        ctx.log_sync = LogSync(ctx.cluster, ctx.host, ctx.alloc_id, ctx.temp_dir, ctx.ray_logs).start()
        if ctx.grown and not joins(ctx):
            sys.exit(0)
        code = run_head(ctx) if ctx.is_head else run_grown(ctx) if ctx.grown else run_worker(ctx)
        del probe
        sys.exit(code)
    except Stop as stop:
        log.info("stopped (%s) before Ray started", stop)
        sys.exit(0)
    except Exception as exc:
        # Before Ray started (a full or unreachable shared filesystem, a bad setting): a head
        # that cannot start ends its allocation at once rather than let the workers wait.
        if isinstance(exc, RaystackError | OSError):
            log.error("%s", exc)
        else:
            log.exception("the node program failed")
        if ctx is not None and ctx.is_head:
            with contextlib.suppress(RaystackError):
                ctx.allocator.release(ctx.alloc_id)
        sys.exit(1)
