"""A `--tls` cluster on the testbed: mutual TLS between Ray's processes, HTTPS in front of the
dashboard, and what another host on the cluster network gets from each listener (nothing)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from raystack import Cluster
from raystack.store import cluster as clusters
from raystack.store import node_entries, tls
from raystack.store.ledger import JobState

from ..conftest import TESTBED_DIR, module_home, processes_of_job
from .listeners import (
    GRPC_METHODS,
    HTTP_PATHS,
    Tls,
    a_driver_running,
    grpc_call,
    http_status,
    kind_of,
    listening,
)
from .test_cluster import raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

NODES = 2

# A framework's driver (open-instruct, NeMo-RL) hands its whole environment to its actors; with
# TLS that includes the driver node's RAY_TLS_SERVER_CERT path, which must name each node's own.
SPREAD_JOB = textwrap.dedent(
    """
    import json, os, socket
    import numpy as np, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray.init(runtime_env={"env_vars": dict(os.environ)})
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])

    @ray.remote(num_cpus=0)
    class Where:
        def host(self, array):
            return socket.gethostname(), int(array.sum()), os.environ["RAY_TLS_SERVER_CERT"]

    big = ray.put(np.ones(32 << 20, dtype=np.uint8))  # 32 MiB: moved by the object manager
    actors = [Where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
              for n in nodes]
    print("SPREAD " + json.dumps(ray.get([a.host.remote(big) for a in actors])))
    """
)


@pytest.fixture(scope="module")
def tc(testbed: Path) -> Iterator[dict]:
    with module_home(testbed, "tls") as home:
        up = raystack("up", "--nodes", str(NODES), "--profile", "testbed", "--tls", "--name", "tc")
        assert up.returncode == 0, up.stderr + up.stdout
        record = clusters.read("tc")
        yield {"home": home, "record": record, "job": record.allocation_id}
        raystack("down", "tc")


def node_shm(host: str) -> Path:
    """A testbed node's own /dev/shm, seen from the host through its init's mount namespace."""
    upid = (TESTBED_DIR / "run" / f"{host}.pid").read_text().strip()
    init = Path(f"/proc/{upid}/task/{upid}/children").read_text().split()[0]
    return Path(f"/proc/{init}/root/dev/shm")


def test_up_tls_serves_https_and_every_node_holds_its_own_certificate(tc: dict) -> None:
    record = tc["record"]
    assert record.tls and record.dashboard_url.startswith(f"https://{record.head_ip}:")
    ca = x509.load_pem_x509_certificate(tls.ca_cert("tc").read_bytes())
    entries = node_entries.read_node_entries("tc")
    assert len(entries) == NODES
    for host, entry in entries.items():
        folder = node_shm(host) / f"rs-tls-{os.getuid()}-{tc['job']}"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        cert = x509.load_pem_x509_certificate((folder / "node.crt").read_bytes())
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert entry["ip"] in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}, host
    assert stat.S_IMODE((tls.folder("tc") / "ca.key").stat().st_mode) == 0o600
    # The client's own calls (State API through the HTTPS front, checked against the CA).
    status = json.loads(raystack("status", "tc", "--json").stdout)
    assert status["nodes_alive"] == NODES and status["ready"], status


def test_every_listener_refuses_peers_without_a_certificate(tc: dict) -> None:
    record = tc["record"]
    token = clusters.read_token("tc")
    head = record.head_host
    with a_driver_running("tc"):
        pids = {pid for pid, _ in processes_of_job(tc["job"])}
        ports = listening(f"rs-{head}", pids)
        ca = tls.ca_cert("tc")
        ident = tls.client("tc")
        kinds = {port: kind_of(port, record.ports) for port in ports}
        assert None not in kinds.values(), f"listeners nobody accounts for: {kinds}"
        assert {"gcs", "node_manager", "object_manager", "agent_grpc", "dashboard", "worker"} <= set(
            kinds.values()
        )
        for port, kind in kinds.items():
            where = f"{kind} {ports[port]}:{port}"
            address = f"{record.head_ip}:{port}"
            if kind in ("autoscaler_metrics", "dashboard_metrics", "dashboard_http"):
                # raystack's held ports (rayproc.hold_port); Ray's dashboard behind the HTTPS front
                assert ports[port] == "127.0.0.1", where
            elif kind in GRPC_METHODS:
                method = GRPC_METHODS[kind]
                # No TLS, or TLS without a certificate: refused in the handshake, before any request.
                assert grpc_call(address, method, token) is grpc.StatusCode.UNAVAILABLE, where
                assert grpc_call(address, method, token, Tls(ca)) is grpc.StatusCode.UNAVAILABLE, where
                # The cluster's certificate but not its token: refused by the token check.
                with_cert = Tls(ca, ident.cert, ident.key)
                assert grpc_call(address, method, None, with_cert) is grpc.StatusCode.UNAUTHENTICATED, where
                served = grpc_call(address, method, token, with_cert)
                assert served is not grpc.StatusCode.UNAUTHENTICATED, where
            elif kind == "dashboard":
                url = f"{record.head_ip}:{port}{HTTP_PATHS[kind]}"
                assert isinstance(http_status(f"http://{url}", token), str), where  # plain HTTP: no answer
                assert isinstance(http_status(f"https://{url}", token), str), where  # unknown CA: refused
                assert http_status(f"https://{url}", None, str(ca)) == 401, where
                assert http_status(f"https://{url}", token, str(ca)) == 200, where
            else:  # Ray's agents speak plain HTTP, token-checked (used from the node itself)
                url = f"http://{record.head_ip}:{port}{HTTP_PATHS[kind]}"
                assert http_status(url) == 401, where
        assert kinds[record.ports["dashboard_http"]] == "dashboard_http"


def test_a_job_spreads_over_every_node_with_its_driver_environment(tc: dict) -> None:
    workdir = tc["home"] / "spread-job"
    workdir.mkdir(exist_ok=True)
    (workdir / "spread.py").write_text(SPREAD_JOB)
    job = Cluster.get("tc").submit(["python", "spread.py"], sets=[f"working_dir={workdir}"])
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.message + job.logs()[-2000:]
    line = next(ln for ln in job.logs().splitlines() if ln.startswith("SPREAD "))
    seen = json.loads(line.removeprefix("SPREAD "))
    assert {host for host, _, _ in seen} == {f"node{i}" for i in range(1, NODES + 1)}
    assert all(total == 32 << 20 for _, total, _ in seen)
    assert len({cert for _, _, cert in seen}) == 1  # the driver's path, each node's own file


def test_ray_status_and_plain_ray_job_submit_with_raystack_env(tc: dict) -> None:
    exports = json.loads(raystack("env", "tc", "--json").stdout)
    assert exports["RAY_USE_TLS"] == "1" and exports["RAY_API_SERVER_ADDRESS"].startswith("https://")
    env = {**os.environ, **exports}
    ray_cli = str(Path(sys.executable).with_name("ray"))
    done = subprocess.run([ray_cli, "status"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert f"0.0/{float(NODES * 4)} GPU" in done.stdout
    submit = [ray_cli, "job", "submit", "--verify", exports["RAY_TLS_CA_CERT"], "--", "python", "-c"]
    done = subprocess.run(
        [*submit, "print('via https')"], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0 and "via https" in done.stdout, done.stdout + done.stderr
    # A client without the cluster's certificate gets nothing from the GCS (and gives up after 5 s
    # of it, not Ray's 60).
    bare = {k: v for k, v in env.items() if k not in tls.RAY_VARIABLES}
    bare["RAY_gcs_rpc_server_reconnect_timeout_s"] = "5"
    done = subprocess.run([ray_cli, "status"], capture_output=True, text=True, timeout=120, env=bare)
    assert done.returncode != 0


def test_dashboard_line_names_the_https_address_and_the_ca(tc: dict) -> None:
    done = raystack("dashboard", "tc", "--json")
    info = json.loads(done.stdout)
    assert info["url"].startswith("https://127.0.0.")
    assert str(tls.ca_cert("tc")) in info["certificate"]


def test_a_working_dir_holding_the_cluster_folder_is_refused_and_nothing_is_lost(tc: dict) -> None:
    """A job of the same user must not carry the token off: the home's parent as working_dir."""
    before = Cluster.get("tc").jobs()
    done = raystack("submit", "--cluster", "tc", "--set", f"working_dir={tc['home'].parent}", "--", "ls")
    assert done.returncode == 1 and "working_dir" in done.stderr and "RAYSTACK_HOME" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # one line
    assert [j.id for j in Cluster.get("tc").jobs()] == [j.id for j in before]


def test_secret_files_never_reach_the_cluster(tc: dict) -> None:
    """What the job sees of its working_dir: the code, not the keys lying beside it."""
    workdir = tc["home"] / "secrets-job"
    (workdir / ".ssh").mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "token", "auth_token", ".ssh/id_ed25519", "server.pem", "client.key"):
        (workdir / name).write_text("x\n")
    listing = "import os; print('FILES', sorted(os.path.join(d, f) for d, _, fs in os.walk('.') for f in fs))"
    job = Cluster.get("tc").submit(["python", "-c", listing], sets=[f"working_dir={workdir}"])
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.message
    line = next(ln for ln in job.logs().splitlines() if ln.startswith("FILES "))
    assert line == "FILES ['./train.py']", line
    shutil.rmtree(workdir, ignore_errors=True)


def test_down_removes_every_node_certificate(tc: dict) -> None:
    hosts = list(node_entries.read_node_entries("tc"))
    done = raystack("down", "tc")
    assert done.returncode == 0, done.stderr
    assert processes_of_job(tc["job"]) == []
    for host in hosts:
        assert not (node_shm(host) / f"rs-tls-{os.getuid()}-{tc['job']}").exists(), host
    shutil.rmtree(tc["home"] / "spread-job", ignore_errors=True)
