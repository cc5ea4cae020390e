"""The node program's pure parts: SLURM variables, ports, and the `ray start` command it builds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from raystack.adapters import slurm
from raystack.adapters.slurm import parse
from raystack.allocation.node import rayproc, raystart
from raystack.allocation.node.context import NodeContext


@pytest.mark.parametrize(
    ("value", "counts"),
    [("16", [16]), ("16(x3)", [16, 16, 16]), ("16(x2),8", [16, 16, 8]), ("72,72", [72, 72])],
)
def test_slurm_job_cpus_per_node(value: str, counts: list[int]) -> None:
    assert parse.parse_cpus_per_node(value) == counts


def test_bad_cpus_per_node_is_an_error() -> None:
    with pytest.raises(ValueError, match="SLURM_JOB_CPUS_PER_NODE"):
        parse.parse_cpus_per_node("lots")


@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        ({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1"}, 4),  # SLURM's count wins
        ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 3),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0),
        ({}, 0),
    ],
)
def test_gpus_come_from_slurm_never_autodetection(env: dict[str, str], gpus: int) -> None:
    assert slurm.gpus_on_node(env) == gpus


def test_ports_are_distinct_and_free() -> None:
    head = rayproc.node_ports(head=True)
    singles = [v for k, v in head.items() if not k.endswith("_worker")]
    assert len(set(singles)) == len(singles)
    assert {"gcs", "dashboard", "client_server", "agent_listen", "runtime_env"} <= set(head)
    low, high = head["min_worker"], head["max_worker"]
    assert high - low + 1 == rayproc.WORKER_PORTS and not any(low <= p <= high for p in singles)
    assert "gcs" not in rayproc.node_ports(head=False)


def context(tmp_path: Path, gpus: int = 4) -> NodeContext:
    return NodeContext(
        cluster="c",
        alloc_id="7",
        node_id=0,
        num_nodes=2,
        host="node1",
        ip="10.0.0.5",
        gpus=gpus,
        cpus=16,
        temp_dir=tmp_path / "rs-7-node1",
        object_store_bytes=2**28,
        join_timeout=30,
    )


def test_head_argv_binds_the_dashboard_to_the_node_address(tmp_path: Path) -> None:
    ports = rayproc.node_ports(head=True)
    argv = raystart.ray_start_argv(context(tmp_path), ports, None)
    assert "--head" in argv and "--block" in argv
    assert "--dashboard-host=10.0.0.5" in argv and "--node-ip-address=10.0.0.5" in argv
    assert "--num-gpus=4" in argv and "--num-cpus=16" in argv
    assert f"--port={ports['gcs']}" in argv and f"--temp-dir={tmp_path / 'rs-7-node1'}" in argv
    assert not any("0.0.0.0" in a for a in argv)


def test_worker_argv_joins_the_head(tmp_path: Path) -> None:
    argv = raystart.ray_start_argv(context(tmp_path, gpus=0), rayproc.node_ports(head=False), "10.0.0.1:6000")
    assert "--address=10.0.0.1:6000" in argv and "--head" not in argv and "--num-gpus=0" in argv


def test_ray_env_turns_token_auth_on_and_puts_this_python_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", "somewhere:1")
    env = raystart.ray_env(context(tmp_path))
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "clusters" / "c" / "token")
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert "RAY_ADDRESS" not in env
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_burst_settings_widen_the_gcs_and_the_profile_env_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    monkeypatch.setenv("RAY_worker_register_timeout_seconds", "300")  # (as the profile's env exports it)
    env = raystart.ray_env(context(tmp_path))
    assert env["RAY_worker_register_timeout_seconds"] == "300"
    assert env["RAY_gcs_server_request_timeout_seconds"] == "120"
    # the GCS gets more threads than Ray's cores/4 on a small head, never fewer on a big one
    assert raystart.burst_settings(cores=2)["RAY_gcs_server_rpc_server_thread_num"] == "8"
    assert raystart.burst_settings(cores=288)["RAY_gcs_server_rpc_server_thread_num"] == "72"
    assert all(k.startswith("RAY_") and v.isdigit() for k, v in raystart.burst_settings().items())
