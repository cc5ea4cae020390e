"""A 6-node cluster on the testbed (issue: start at scale), where every node shares the same 2
cores (bench/cluster_ready.py measures 1 to 32 nodes; this is CI's short version):

1. `raystack up --nodes 6 --profile testbed` is READY: the workers join in waves of the
   profile's `join_window` (4: a late worker starts only once enough nodes have joined).
2. The first `ray start` of the last node is killed while the head still waits for its nodes:
   the node program tries again (jittered back-off) and the node joins; no node counts twice.
3. `raystack status` says 6/6 nodes alive.
4. A GRPO-style init burst: 24 actors created at once, round robin over all 6 nodes, all
   come up without a registration timeout (bench/cluster_ready.py times 300 at N = 4 and 16;
   on 2 cores that takes 9 to 15 minutes, too long for CI).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.spec.profile import load_profile
from raystack.store import paths
from raystack.store.ledger import JobState

from ..conftest import NODES, TESTBED, TESTBED_DIR, wait_until
from .test_cluster import raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

SCALE, ACTORS, LATE = 6, 24, "node6"
WINDOW = load_profile("testbed").join_window
JOBS = Path(__file__).resolve().parents[2] / "jobs" / "debug"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


@pytest.fixture(scope="module")
def big_testbed(testbed: Path) -> Iterator[Path]:
    """The testbed grown to SCALE nodes for this module, and back to the session's size after."""
    subprocess.run([str(TESTBED / "up"), "--nodes", str(SCALE)], check=True, stdout=subprocess.DEVNULL)
    yield testbed
    subprocess.run([str(TESTBED / "up"), "--nodes", str(NODES)], check=True, stdout=subprocess.DEVNULL)


def address_of(host: str) -> str:
    lines = (TESTBED_DIR / "etc" / "hosts").read_text().splitlines()
    return next(line.split()[0] for line in lines if line.split()[1:] == [host])


def kill_ray_start(ip: str) -> int | None:
    """SIGKILL the `ray start` of the node with this address, once it runs; its pid."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        launcher = any(a.endswith(b"/ray") for a in argv[:2])  # (python3 .../bin/ray start ...)
        if launcher and b"start" in argv and f"--node-ip-address={ip}".encode() in argv:
            os.kill(int(proc.name), signal.SIGKILL)
            return int(proc.name)
    return None


def when(line: str) -> float:
    match = STAMP.match(line)
    assert match, line
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_nodes_join_in_waves_survive_a_failed_start_and_run_an_actor_burst(
    big_testbed: Path, rs_home: Path
) -> None:
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raystack.cli",
            "up",
            "--nodes",
            str(SCALE),
            "--profile",
            "testbed",
            "--name",
            "big",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        killed = wait_until(
            lambda: kill_ray_start(address_of(LATE)), 300, f"{LATE}'s ray start", interval=0.1
        )
        out, _ = up.communicate(timeout=600)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, out
    folder = paths.cluster("big")

    # 1. Waves: the last node started Ray only once enough nodes had joined.
    late_log = folder.node_log(LATE).read_text(errors="replace")
    node_id = int(re.search(rf" id (\d+) of {SCALE}", late_log).group(1))  # type: ignore[union-attr]
    first_start = when(
        next(line for line in late_log.splitlines() if "INFO [raystack.node] starting:" in line)
    )
    head_log = folder.node_log("node1").read_text(errors="replace").splitlines()
    joined_then = max(
        (
            int(m.group(1))
            for line in head_log
            if (m := re.search(rf"\] (\d+)/{SCALE} nodes joined", line)) and when(line) <= first_start
        ),
        default=0,
    )
    assert node_id > WINDOW and joined_then >= node_id - WINDOW + 1, (node_id, joined_then)

    # 2. The killed first try was followed by another, which joined.
    assert killed and "ray start exited with code" in late_log and "trying again" in late_log, late_log[
        -2000:
    ]

    # 3. Every node counted once.
    status = json.loads(raystack("status", "big", "--json").stdout)
    assert status["nodes_alive"] == SCALE and status["gpus"] == 4 * SCALE, status

    # 4. The init burst of a GRPO job: every actor comes up, on every node.
    job = Cluster("big").submit(
        str(JOBS / "actors.yaml"), sets=[f"entrypoint=python actors.py --actors {ACTORS} --timeout 600"]
    )
    record = job.wait(timeout=1200)
    logs = job.logs()
    assert record.state is JobState.SUCCEEDED, logs[-3000:]
    result = json.loads(next(line for line in logs.splitlines() if line.startswith('{"actors"')))
    assert result["alive"] == ACTORS and result["error_count"] == 0, result
    assert len(result["per_host"]) == SCALE, result
    raystack("down", "big")
