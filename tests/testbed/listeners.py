"""Every TCP listener of a cluster's node, and a probe per protocol that asks it for something only
an authenticated peer may have: what the security tests knock on.

The probes come from another network namespace (the testbed's login host, where pytest runs):
another host on the cluster network, as the threat model has it.
"""

from __future__ import annotations

import contextlib
import re
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

# One method per gRPC server kind that Ray guards with the token (empty request bodies: the
# token check comes first). Ray's services, as in its .proto files.
GRPC_METHODS = {
    "gcs": "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "node_manager": "/ray.rpc.NodeManagerService/GetNodeStats",
    "object_manager": "/ray.rpc.ObjectManagerService/Pull",
    "agent_grpc": "/ray.rpc.LogService/ListLogs",
    "client_server": "/ray.rpc.RayletDriver/ClusterInfo",
    "worker": "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",
}
# HTTP listeners: a path that needs the token.
HTTP_PATHS = {
    "dashboard": "/api/jobs/",
    "agent_listen": "/api/job_agent/jobs/",
    "runtime_env": "/get_or_create_runtime_env",
}


@dataclass(frozen=True)
class Tls:
    """What a gRPC client presents: the CA it trusts and, optionally, its own certificate."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None


SLURM = {"srun", "slurmstepd"}  # the allocation's own (SLURM's I/O ports, munge-authenticated)


def with_descendants(pids: set[int]) -> set[int]:
    """`pids` and every process they started. (Ray's daemons retitle themselves, which can clobber
    what /proc/<pid>/environ shows: the tree finds them where SLURM_JOB_ID may not.)"""
    import psutil

    found = set(pids)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    return found


def listening(netns: str, pids: set[int]) -> dict[int, str]:
    """TCP ports listened on in a node's network namespace by processes in `pids` or descended
    from them (SLURM's own left out): port -> address."""
    pids = with_descendants(pids)
    out = subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", "ss", "-Hltnp"], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if not owners & pids or set(re.findall(r'"([^"]+)",pid=', line)) <= SLURM:
            continue
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        found[int(port)] = address.strip("[]")
    return found


def kind_of(port: int, ports: dict[str, int]) -> str | None:
    """The listener's name in the cluster record's ports (worker ports by range)."""
    for name, value in ports.items():
        if name not in ("min_worker", "max_worker") and value == port:
            return name
    if ports.get("min_worker", 1) <= port <= ports.get("max_worker", 0):
        return "worker"
    return None


def grpc_call(
    address: str, method: str, token: str | None = None, tls: Tls | None = None, timeout: float = 10
) -> grpc.StatusCode:
    """The status of one unary call with an empty request (OK when the server answered)."""
    if tls is None:
        channel = grpc.insecure_channel(address)
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=tls.ca.read_bytes(),
            private_key=tls.key.read_bytes() if tls.key else None,
            certificate_chain=tls.cert.read_bytes() if tls.cert else None,
        )
        channel = grpc.secure_channel(address, creds)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    try:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        call(b"", metadata=metadata, timeout=timeout)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        channel.close()


def http_status(url: str, token: str | None = None, verify: str | bool = True) -> int | str:
    """The HTTP status of a GET (POST for the runtime-env agent), or the connection error's name."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
    )
    method = "POST" if url.endswith("runtime_env") else "GET"
    try:
        return httpx.request(method, url, headers=headers, verify=context, timeout=10).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


@contextlib.contextmanager
def a_driver_running(cluster: str) -> Iterator[None]:
    """A job whose driver holds a Ray worker port (the core worker's gRPC server) while inside."""
    from raystack import Cluster

    job = Cluster.get(cluster).submit(
        ["python", "-c", "import ray, time; ray.init(); print('IN', flush=True); time.sleep(300)"],
        sets=["name=listener-probe"],
    )
    deadline = time.monotonic() + 120
    try:
        while "IN" not in job.logs():
            record = job.record()
            assert not record.state.is_terminal(), f"{record.state.value}: {record.message}"
            assert time.monotonic() < deadline, "the probe job did not start"
            time.sleep(0.5)
        yield
    finally:
        job.stop()
