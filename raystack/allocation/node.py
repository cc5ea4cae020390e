"""The per-node program inside an allocation: `srun --ntasks-per-node=1 python -m raystack.allocation.node`.

Node 0 (SLURM_NODEID=0) runs the head (allocation/head.py), the others join it as workers
(allocation/worker.py). Every node stops only its own Ray processes (never a global `ray stop`,
which would kill other clusters sharing the node).

Configuration comes from the environment the allocation script exports:
RAYSTACK_HOME, RAYSTACK_CLUSTER, RAYSTACK_LOCAL_SCRATCH, RAYSTACK_OBJECT_STORE_MEMORY,
RAYSTACK_JOIN_TIMEOUT, RAYSTACK_HEAD_GRACE, RAYSTACK_RAY_LOGS, plus SLURM's own variables.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from raystack.allocation.context import (
    Stop,
    context_from_env,
    node_certificate,
    on_signal,
    private_temp_dir,
)
from raystack.allocation.head import run_head
from raystack.allocation.logsync import LogSync
from raystack.allocation.rayproc import become_subreaper
from raystack.allocation.worker import run_worker
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.files import make_private_dirs

log = logging.getLogger("raystack.node")


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
    )
    os.umask(0o077)  # whatever the allocation script or the user's shell had
    become_subreaper()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # NOTE: the walltime warning goes to the batch shell only (--signal=B:USR1), which leaves a
    # flag file for the head; a USR1 sent to the whole step by hand must not end the node.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        ctx = private_temp_dir(context_from_env(dict(os.environ)))
        make_private_dirs(paths.cluster(ctx.cluster))
        records.ensure_token(ctx.cluster)
        ctx = node_certificate(ctx, dict(os.environ))
        entry = {
            "ip": ctx.ip,
            "node_id": ctx.node_id,
            "pid": os.getpid(),
            "gpus": ctx.gpus,
            "cpus": ctx.cpus,
            "job_id": ctx.job_id,
            "started": time.time(),
        }
        records.write_node_entry(ctx.cluster, ctx.host, entry)
        log.info(
            "allocation %s: node %s (%s) id %d of %d: %d GPUs, %d CPUs, cluster %s",
            ctx.job_id,
            ctx.host,
            ctx.ip,
            ctx.node_id,
            ctx.num_nodes,
            ctx.gpus,
            ctx.cpus,
            ctx.cluster,
        )
        ctx.log_sync = LogSync(ctx.cluster, ctx.host, ctx.job_id, ctx.temp_dir, ctx.ray_logs).start()
        sys.exit(run_head(ctx) if ctx.is_head else run_worker(ctx))
    except Stop as stop:
        log.info("stopped (%s) before Ray started", stop)
        sys.exit(0)
    except RaystackError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
