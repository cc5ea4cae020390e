"""The `ray start` of a node: its environment, its command line (ports, resources, TLS, the
settings for a large start), and its stop at teardown."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

from raystack.allocation.node import tempsweep
from raystack.allocation.node.context import NodeContext, ignore_signals
from raystack.allocation.node.rayproc import RayProcess
from raystack.launch import NODE_TMP_ENV
from raystack.store import paths, tls

log = logging.getLogger("raystack.node")

TLS_CONNECTIONS = "16"  # Ray's object-manager connections per peer with TLS on [4]


def metrics_on() -> bool:
    """The profile's `metrics: true` (RAYSTACK_METRICS=1 from the allocation script)."""
    return os.environ.get("RAYSTACK_METRICS") == "1"


def burst_settings(cores: int | None = None) -> dict[str, str]:
    """Ray settings that let the head's GCS ride out the registration burst of a large start
    (every raylet, then hundreds of actor workers, at once). Each only widens a timeout or a
    thread pool or thins steady background traffic, so nothing changes on a small cluster. Ray
    2.60's defaults in brackets; a profile's `env` overrides any of them."""
    cores = cores or os.cpu_count() or 1
    threads = str(max(8, cores // 4))
    return {
        # The GCS handles RegisterNode/RegisterWorker/GetNodeInfo on cores/4 threads [1 on a small
        # head]: more threads drain a burst of blocking handlers instead of queueing behind one.
        "RAY_gcs_server_rpc_server_thread_num": threads,
        "RAY_gcs_server_rpc_client_thread_num": threads,  # its replies to raylets, likewise
        # A raylet's or core worker's first connection to a busy GCS may take longer than 5 s [5].
        "RAY_gcs_rpc_server_connect_timeout_s": "30",
        # Synchronous GCS calls (`ray start`'s "Failed to get node info: Deadline Exceeded") [60].
        "RAY_gcs_server_request_timeout_seconds": "120",
        # Raylets and workers that lose the GCS during a burst exit after this [60].
        "RAY_gcs_rpc_server_reconnect_timeout_s": "120",
        # An actor's worker process not registered with its raylet by then is killed [60]: a burst
        # of several hundred actors starting on few cores takes longer.
        "RAY_worker_register_timeout_seconds": "120",
        # gRPC keepalive pings from every worker to the GCS [10 s / 20 s]: fewer during a burst;
        # dead nodes are still found by the GCS health checks, which are left as they are.
        "RAY_grpc_keepalive_time_ms": "60000",
        "RAY_grpc_keepalive_timeout_ms": "60000",
    }


def ray_env(ctx: NodeContext) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in burst_settings().items():
        env.setdefault(key, value)  # (the profile's env, exported by the allocation script, wins)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(paths.cluster(ctx.cluster).token),
        # NOTE: without this, SIGTERM makes `ray start --block` drain for up to 30 s.
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        RAY_USAGE_STATS_ENABLED="0",
        RAYSTACK_CLUSTER=ctx.cluster,
        RAYSTACK_ALLOCATION=ctx.alloc_id,  # SLURM's job id, or a local cluster's id
    )
    # (the node's private temp folder, removed by stop_ray: the launchers' working_dirs and logs)
    env[NODE_TMP_ENV] = str(ctx.temp_root or ctx.temp_dir)
    if not metrics_on():
        # Ray's Prometheus exporter listens on every interface without auth (task and actor
        # names, node addresses, resource use): off unless the profile asks (`metrics: true`).
        env["RAY_enable_metrics_collection"] = "0"
    if ctx.tls is not None:
        env.update(tls.ray_env(ctx.tls, tls.ca_cert(ctx.cluster)))
        # Each of Ray's object-manager connections to a peer encrypts on one thread: with its
        # default 4, a TLS transfer stopped near 1 GiB/s whatever the cores (bench/tls_one_host.py,
        # 16-core host: 0.98 GiB/s; with 16: 2.6 GiB/s). (The profile's env wins.)
        env.setdefault("RAY_object_manager_client_connection_num", TLS_CONNECTIONS)
    else:
        for name in tls.RAY_VARIABLES:
            env.pop(name, None)  # (a shell that had a TLS cluster's `raystack env`)
    env.pop("RAY_ADDRESS", None)
    # NOTE: a job's `python` is the first on the PATH of `ray start`: make it this venv's.
    bindir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bindir:
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    return env


def ray_start_argv(ctx: NodeContext, ports: dict[str, int], head_address: str | None) -> list[str]:
    ray = str(Path(sys.executable).with_name("ray"))
    argv = [
        ray if Path(ray).exists() else "ray",
        "start",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={ctx.ip}",
        f"--temp-dir={ctx.temp_dir}",
        f"--num-cpus={ctx.cpus}",
        f"--num-gpus={ctx.gpus}",
        f"--object-store-memory={ctx.object_store_bytes}",
        f"--object-manager-port={ports['object_manager']}",
        f"--node-manager-port={ports['node_manager']}",
        f"--dashboard-agent-listen-port={ports['agent_listen']}",
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--metrics-export-port={ports['metrics']}",
        f"--runtime-env-agent-port={ports['runtime_env']}",
        f"--min-worker-port={ports['min_worker']}",
        f"--max-worker-port={ports['max_worker']}",
    ]
    if head_address is None:
        # With TLS the dashboard (plain HTTP) listens on 127.0.0.1 only, behind the HTTPS front
        # (allocation/head/tlsfront.py) on the node's address.
        inner = ctx.tls is not None
        argv += [
            "--head",
            f"--port={ports['gcs']}",
            f"--dashboard-host={'127.0.0.1' if inner else ctx.ip}",
            f"--dashboard-port={ports['dashboard_http' if inner else 'dashboard']}",
            f"--ray-client-server-port={ports['client_server']}",
            "--include-dashboard=true",
        ]
    else:
        argv += [f"--address={head_address}"]
    return argv


def stop_ray(ctx: NodeContext, ray: RayProcess) -> None:
    """Stop this node's Ray processes (only ours: never a global `ray stop`) and its temp dir."""
    ignore_signals()
    ray.stop()
    if ctx.log_sync is not None:
        ctx.log_sync.final()  # (Ray has stopped: its logs are complete; the temp dir goes next)
    shutil.rmtree(tempsweep.retire(ctx.temp_root or ctx.temp_dir), ignore_errors=True)
    if ctx.tls is not None:
        shutil.rmtree(ctx.tls.cert.parent, ignore_errors=True)
    log.info("node %s: Ray processes of cluster %s stopped", ctx.host, ctx.cluster)
