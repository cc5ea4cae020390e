"""`raystack up/env/status/list/down` on the testbed: real SLURM, real multi-node Ray, real Jobs API."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from raystack import Cluster
from raystack.client.cluster import loopback_for
from raystack.store import cluster as clusters
from raystack.store import paths
from raystack.store.cluster import ClusterState

from ..conftest import NODES, module_home, processes_of_job, slurm_shims, wait_until
from .listeners import (
    GRPC_METHODS,
    HTTP_PATHS,
    a_driver_running,
    grpc_call,
    http_status,
    kind_of,
    listening,
)

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

RESOURCES_JOB = """
import json, ray
ray.init()
alive = [n for n in ray.nodes() if n["Alive"]]
print("RESOURCES " + json.dumps({"nodes": len(alive), **ray.cluster_resources()}))
"""


def raystack(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "raystack.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def ray_job_submit(cluster: str, workdir: Path, *entrypoint: str) -> subprocess.CompletedProcess:
    """Plain `ray job submit`, configured only by `raystack env` (as the README says)."""
    exports = json.loads(raystack("env", cluster, "--json").stdout)
    ray_cli = str(Path(sys.executable).with_name("ray"))
    return subprocess.run(
        [ray_cli, "job", "submit", "--working-dir", str(workdir), "--", *entrypoint],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **exports},
    )


def resources_from(output: str) -> dict:
    line = next(ln for ln in output.splitlines() if ln.startswith("RESOURCES "))
    return json.loads(line.removeprefix("RESOURCES "))


@pytest.fixture(scope="module")
def four(testbed: Path) -> Iterator[dict]:
    """One 4-node cluster shared by the tests of this module, started with the real CLI and the
    card's own command: no profile, so whole nodes (every CPU and GPU, from sinfo)."""
    with module_home(testbed, "four") as home:
        up = raystack("up", "--nodes", str(NODES), "--name", "four")
        assert up.returncode == 0, up.stderr + up.stdout
        yield {"home": home, "up": up, "job": clusters.read("four").allocation_id}
        raystack("down", "four")


def test_up_reports_ready_with_dashboard_tunnel_and_env(four: dict) -> None:
    out = four["up"].stdout
    record = clusters.read("four")
    assert record.state is ClusterState.READY
    assert f"cluster four READY: SLURM job {four['job']}, {NODES} nodes" in out
    assert f"{NODES * 4} GPUs" in out
    port = record.ports["dashboard"]
    assert f"dashboard: http://{record.head_ip}:{port}" in out
    loopback = loopback_for("four")  # the cluster's own: two clusters' dashboard cookies never mix
    assert f"ssh -N -L {loopback}:{port}:{record.head_ip}:{port} " in out
    info = json.loads(raystack("dashboard", "four", "--json").stdout)
    assert info["url"] == f"http://{loopback}:{port}" and "ray get-auth-token" in info["login"]
    assert 'eval "$(raystack env four)"' in out
    assert "STARTING" in four["up"].stderr  # progress was shown while waiting
    assert "whole nodes: 16 CPUs and 4 GPUs per node, all memory, as partition testbed's" in four["up"].stderr
    assert record.nodes == [f"node{i}" for i in range(1, NODES + 1)]
    assert record.walltime_end and record.walltime_end > record.created


def test_the_first_jobs_cold_start_is_paid_before_ready_and_leaves_no_job(four: dict) -> None:
    """The head ran its warm-up job through the Jobs API before READY (allocation/head/warmup.py) and
    deleted it: Ray's own job list does not show it."""
    record = clusters.read("four")
    log = paths.cluster("four").node_log(record.head_host).read_text()
    warm, ready = log.find("warm-up job SUCCEEDED in "), log.find("cluster four READY")
    assert 0 <= warm < ready, log[-3000:]
    env = {**os.environ, **json.loads(raystack("env", "four", "--json").stdout)}
    ray_cli = str(Path(sys.executable).with_name("ray"))

    def unlisted() -> bool:
        listed = subprocess.run([ray_cli, "job", "list"], capture_output=True, text=True, timeout=60, env=env)
        assert listed.returncode == 0, listed.stderr
        return "raystack-warmup-" not in listed.stdout

    wait_until(unlisted, 20, "the warm-up job to be deleted (a few seconds after it ended)")
    assert unlisted()  # (and not written back by Ray's job manager)


def test_plain_ray_job_submit_sees_every_node_and_gpu(four: dict, tmp_path: Path) -> None:
    workdir = four["home"] / "resources-job"
    workdir.mkdir(exist_ok=True)
    (workdir / "resources.py").write_text(RESOURCES_JOB)
    done = ray_job_submit("four", workdir, "python", "resources.py")
    assert done.returncode == 0, done.stdout + done.stderr
    found = resources_from(done.stdout)
    assert found["nodes"] == NODES
    assert found["GPU"] == NODES * 4
    assert found["CPU"] == NODES * 16  # every CPU of every node: no profile asks whole nodes


def test_ray_status_works_with_raystack_env(four: dict) -> None:
    exports = json.loads(raystack("env", "four", "--json").stdout)
    ray_cli = str(Path(sys.executable).with_name("ray"))
    done = subprocess.run(
        [ray_cli, "status"], capture_output=True, text=True, timeout=60, env={**os.environ, **exports}
    )
    assert done.returncode == 0, done.stderr
    assert f"{float(NODES * 4)} GPU" in done.stdout or f"0.0/{float(NODES * 4)} GPU" in done.stdout


def test_env_prints_token_by_path_not_value(four: dict) -> None:
    out = raystack("env", "four").stdout
    token = clusters.read_token("four")
    assert token not in out
    assert f"export RAY_AUTH_TOKEN_PATH={paths.cluster('four').token}" in out
    assert "export RAY_AUTH_MODE=token" in out


def test_jobs_api_refuses_requests_without_the_token(four: dict) -> None:
    url = clusters.read("four").dashboard_url
    assert httpx.get(f"{url}/api/jobs/").status_code in (401, 403)
    wrong = {"Authorization": "Bearer " + "0" * 64}
    assert httpx.get(f"{url}/api/jobs/", headers=wrong).status_code in (401, 403)
    right = {"Authorization": f"Bearer {clusters.read_token('four')}"}
    assert httpx.get(f"{url}/api/jobs/", headers=right).status_code == 200


def test_token_and_folder_are_private(four: dict) -> None:
    assert stat.S_IMODE(os.stat(paths.cluster("four").token).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(paths.cluster("four").root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(paths.cluster("four").record).st_mode) == 0o600


def test_dashboard_binds_the_node_address_only(four: dict) -> None:
    record = clusters.read("four")
    assert record.dashboard_url == f"http://{record.head_ip}:{record.ports['dashboard']}"
    assert not record.head_ip.startswith(("0.", "127."))


def test_status_json_and_exit_code(four: dict) -> None:
    done = raystack("status", "four", "--json")
    assert done.returncode == 0, done.stderr
    st = json.loads(done.stdout)
    assert st["ready"] is True
    assert st["nodes_alive"] == NODES and st["gpus"] == NODES * 4 and st["cpus"] == NODES * 16
    assert st["allocation_state"] == "RUNNING" and 0 < st["time_left_s"] <= 2 * 3600
    assert st["slurm_state"] == "RUNNING" and "slurm_state" in st["deprecated"]  # (the 0.1 name, one release)


def test_commands_ask_slurm_about_their_own_job_once(four: dict, tmp_path: Path) -> None:
    """No unfiltered squeue (megabytes on a busy site), and one query per command."""
    calls = slurm_shims(tmp_path / "shims")
    env = {"PATH": f"{tmp_path / 'shims'}:{os.environ['PATH']}"}
    for args in (["status", "four"], ["queue", "four"], ["list"], ["env", "four"], ["status"]):
        calls.write_text("")
        done = raystack(*args, env=env)
        assert done.returncode == 0, (args, done.stderr)
        asked = calls.read_text().splitlines()
        squeues = [c for c in asked if c.startswith("squeue")]
        assert len(squeues) <= 1, (args, asked)
        assert all(f"--jobs={four['job']}" in c for c in squeues), asked


def test_name_may_be_omitted_with_one_cluster(four: dict) -> None:
    assert raystack("status").returncode == 0
    listed = json.loads(raystack("list", "--json").stdout)
    assert [(c["name"], c["state"]) for c in listed] == [("four", "READY")]


def test_name_in_use_is_refused_and_the_live_cluster_survives(four: dict) -> None:
    done = raystack("up", "--nodes", "1", "--profile", "testbed", "--name", "four")
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert "name 'four' is in use by a live cluster" in done.stderr
    assert "raystack down four" in done.stderr
    assert Cluster.get("four").status().ready


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    """A command run by another Unix user on the same machine (the testbed's nodes share it)."""
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", *argv], capture_output=True, text=True, timeout=30
    )


def test_another_user_on_the_node_cannot_enter_anything_of_the_cluster(four: dict) -> None:
    roots = sorted(Path("/tmp").glob(f"rs-{four['job']}-node*-*"))
    assert len(roots) == NODES, roots  # one private folder per node, named unpredictably
    for root in roots:
        st = root.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid(), root
        session = root / "r" / "session_latest"
        logs = sorted((session / "logs").glob("*.out"))
        sockets = sorted((session / "sockets").iterdir())
        assert logs and sockets  # Ray's own, inside: it chmods them 0777, the folder keeps them
        assert as_nobody("ls", str(root)).returncode != 0
        assert as_nobody("cat", str(logs[0])).returncode != 0
        probe = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(sockets[0])!r})"
        assert as_nobody(sys.executable, "-c", probe).returncode != 0
    folder = paths.cluster("four")
    assert stat.S_IMODE(folder.root.stat().st_mode) == 0o700
    assert as_nobody("cat", str(folder.token)).returncode != 0
    assert as_nobody("ls", str(folder.logs)).returncode != 0


def test_metrics_exporter_is_closed_by_default(four: dict) -> None:
    import socket

    record = clusters.read("four")
    with socket.socket() as sock:
        sock.settimeout(3)
        assert sock.connect_ex((record.head_ip, record.ports["metrics"])) != 0


def test_every_listener_of_the_head_refuses_requests_without_the_token(four: dict) -> None:
    """From another host on the cluster network: each TCP listener of the head's Ray (found, not
    listed by hand: a new one fails this test until it is accounted for) refuses a request without
    the token and serves one with it. gRPC servers read the request before the check (Ray's
    limit: up to 512 MiB); `tls: true` (test_security.py) refuses those peers in the handshake."""
    record = clusters.read("four")
    token = clusters.read_token("four")
    with a_driver_running("four"):
        pids = {pid for pid, _ in processes_of_job(four["job"])}
        ports = listening(f"rs-{record.head_host}", pids)
        kinds = {port: kind_of(port, record.ports) for port in ports}
        assert None not in kinds.values(), f"listeners nobody accounts for: {kinds}"
        expected = {"gcs", "node_manager", "object_manager", "agent_grpc", "agent_listen", "runtime_env"}
        expected |= {"dashboard", "autoscaler_metrics", "dashboard_metrics"}
        found = set(kinds.values())
        assert expected | {"worker"} <= found <= expected | {"worker", "client_server"}, (kinds, ports)
        for port, kind in kinds.items():
            where = f"{kind} {ports[port]}:{port}"
            if kind in ("autoscaler_metrics", "dashboard_metrics"):  # Ray's counters, no auth: held
                assert ports[port] == "127.0.0.1", where  # by raystack's own socket (rayproc.hold_port)
            elif kind in GRPC_METHODS:
                address, method = f"{record.head_ip}:{port}", GRPC_METHODS[kind]
                refused = grpc.StatusCode.UNAUTHENTICATED
                assert grpc_call(address, method) is refused, where
                assert grpc_call(address, method, "0" * 64) is refused, where
                assert grpc_call(address, method, token) is not refused, where
            else:
                url = f"http://{record.head_ip}:{port}{HTTP_PATHS[kind]}"
                assert http_status(url) == 401, where
                assert http_status(url, token) != 401, where


def test_down_releases_the_nodes_and_leaves_no_process(four: dict) -> None:
    done = raystack("down", "four")
    assert done.returncode == 0, done.stderr
    assert "STOPPED" in done.stdout
    assert clusters.read("four").state is ClusterState.STOPPED
    assert processes_of_job(four["job"]) == []
    assert raystack("status", "four").returncode == 1
    # The logs outlive the allocation.
    logs = paths.cluster("four").logs
    assert (logs / f"allocation-{four['job']}.log").is_file()
    assert {p.name for p in logs.glob("node-*.log")} == {f"node-node{i}.log" for i in range(1, NODES + 1)}
