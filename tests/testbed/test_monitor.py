"""Watching a live 2-node cluster (issue: top, report, idle autostop, dashboard metrics), in the
order a user meets them, on one cluster started with metrics on, usage sampled every 2 s and a
40 s idle timeout, as the first of a chain of two allocations:

1. Prometheus (Debian's, found on PATH) runs on the head and scrapes Ray's metrics of every
   node; the dashboard reaches it (RAY_PROMETHEUS_HOST).
2. `raystack top --once --json` sees a job burning one core on the worker node, and the job's
   raystack name is in the dashboard's job list.
3. After a scripted idle gap, a plain `ray job submit` job that runs longer than the idle
   timeout keeps the cluster up; then the cluster goes down by itself, ending its chain.
4. `raystack report` after that: the idle time within 10% of what the jobs' own clocks say.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack.adapters.ray import Dashboard
from raystack.errors import RayApiError
from raystack.store import cluster as clusters
from raystack.store import node_entries
from raystack.store.cluster import ClusterState
from raystack.store.ledger import JobState, read_job

from ..conftest import module_home, slurm_jobs_alive, wait_until
from .test_cluster import ray_job_submit, raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

NAME, IDLE_TIMEOUT, GAP, PLAIN_JOB = "mon", 40, 10, 50
JOBS = Path(__file__).resolve().parents[2] / "jobs" / "debug"
PROFILE = f"""\
description: testbed with metrics, fast usage samples and a short idle timeout
partition: testbed
gpus_per_node: 4
cpus_per_task: 4
object_store_memory: 256MB
join_timeout: 120s
metrics: true
idle_timeout: {IDLE_TIMEOUT}s
env:
  RAYSTACK_TESTBED: "1"
  RAYSTACK_SAMPLE_EVERY: "2"
"""


@pytest.fixture(scope="module")
def mon(testbed: Path) -> Iterator[dict]:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is not installed: slurm/testbed/up installs Debian's")
    with module_home(testbed, "mon") as home:
        profile = home / "monitor.yaml"
        profile.write_text(PROFILE)
        up = raystack("up", "--nodes", "2", "--profile", str(profile), "--chain", "2", "--name", NAME)
        assert up.returncode == 0, up.stderr + up.stdout
        yield {"home": home, "job": clusters.read(NAME).allocation_id, "times": {}}
        raystack("down", NAME)


def head_get(record: clusters.ClusterRecord, url: str) -> dict:
    """GET a URL as a program on the head node sees it (Prometheus listens on its loopback)."""
    code = f"import urllib.request as u, sys; sys.stdout.write(u.urlopen({url!r}, timeout=5).read().decode())"
    out = subprocess.run(
        ["nsenter", f"--net=/run/netns/rs-{record.head_host}", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_prometheus_on_the_head_scrapes_every_node(mon: dict) -> None:
    record = clusters.read(NAME)
    assert record.prometheus and record.prometheus.startswith("http://127.0.0.1:")
    ips = {e["ip"] for e in node_entries.read_node_entries(NAME).values()}
    assert len(ips) == 2
    query = f"{record.prometheus}/api/v1/query?query={urllib.parse.quote('ray_node_cpu_utilization')}"

    def scraped() -> set[str] | None:
        result = head_get(record, query)["data"]["result"]
        seen = {r["metric"].get("ip") or r["metric"]["instance"].rsplit(":", 1)[0] for r in result}
        return seen if ips <= seen else None

    wait_until(scraped, 45, "Prometheus to hold Ray's node metrics of both nodes", interval=2)
    # The dashboard was started pointing at it (its Metrics features query it server-side).
    dash = Dashboard.of(NAME, str(record.dashboard_url))
    try:  # HTTP 500 ("prometheus healthcheck failed.") unless the dashboard's query reached it
        dash._get("/api/prometheus_health")
    except RayApiError as exc:
        pytest.fail(f"the dashboard does not reach the head's Prometheus: {exc}")
    status = raystack("status", NAME)
    assert f"Prometheus on the head at {record.prometheus}" in status.stdout


def top_json() -> dict:
    out = raystack("top", NAME, "--once", "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads(out.stdout)


def test_top_sees_a_job_burning_one_core_on_the_worker(mon: dict) -> None:
    sub = raystack("submit", str(JOBS / "burn.yaml"), "--cluster", NAME, "--json")
    assert sub.returncode == 0, sub.stderr + sub.stdout
    job_id = json.loads(sub.stdout)["id"]
    mon["burn"] = job_id
    worker_ip = next(e["ip"] for h, e in node_entries.read_node_entries(NAME).items() if e["node_id"] != 0)

    def burning() -> dict | None:
        view = top_json()
        nodes = {n["ip"]: n for n in view["nodes"]}
        worker = nodes.get(worker_ip)
        return view if worker and worker["ray_cpu"] is not None and worker["ray_cpu"] >= 0.6 else None

    view = wait_until(burning, 40, "top to show about one core busy on the worker")
    assert isinstance(view, dict)
    head = next(n for n in view["nodes"] if n["head"])
    worker = next(n for n in view["nodes"] if not n["head"])
    assert worker["ray_cpu"] <= 1.6, worker  # one core (psutil's per-process %, 5 s reports)
    assert head["ray_cpu"] < worker["ray_cpu"], (head, worker)
    assert len(worker["gpus"]) == 0 and worker["mem_total"] > 0 and worker["cpu_percent"] is not None
    assert [j["id"] for j in view["running"]] == [job_id] and view["running"][0]["name"] == "burn"
    assert view["idle_s"] is None and view["queued"] == 0
    assert 0 < view["time_left_s"] <= 2 * 3600
    # The dashboard's job list names it (metadata job_name).
    dash = Dashboard.of(NAME, str(clusters.read(NAME).dashboard_url))
    assert any((j.metadata or {}).get("job_name") == "burn" for j in dash.list_jobs())
    wait_until(lambda: read_job(NAME, job_id).state.is_terminal(), 90, "the burn job to end")
    assert read_job(NAME, job_id).state is JobState.SUCCEEDED


def test_a_plain_ray_job_longer_than_the_idle_timeout_keeps_the_cluster_up(mon: dict) -> None:
    wait_until(lambda: top_json()["idle_s"] is not None, 30, "the cluster to count as idle")
    time.sleep(GAP)  # a scripted idle gap
    assert clusters.read(NAME).state is ClusterState.READY
    script = JOBS.parent.parent / "tests" / "testbed"  # any small working_dir
    code = (
        "import json,time; print(json.dumps({'plain':'start','t':time.time()}), flush=True); "
        f"time.sleep({PLAIN_JOB}); print(json.dumps({{'plain':'end','t':time.time()}}), flush=True)"
    )
    out = ray_job_submit(NAME, script, "python", "-c", code)
    assert out.returncode == 0, out.stderr + out.stdout
    marks = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith('{"plain"')]
    assert [m["plain"] for m in marks] == ["start", "end"], out.stdout
    mon["plain"] = (marks[0]["t"], marks[1]["t"])
    record = clusters.read(NAME)
    assert record.state is ClusterState.READY, record.message  # it ran past the idle timeout


def test_idle_autostop_ends_the_cluster_and_its_chain(mon: dict) -> None:
    def stopped() -> clusters.ClusterRecord | None:
        record = clusters.read(NAME)
        return record if record.state.is_terminal() else None

    record = wait_until(stopped, IDLE_TIMEOUT + 60, "the idle cluster to go down by itself", interval=1)
    assert isinstance(record, clusters.ClusterRecord)
    assert record.state is ClusterState.STOPPED and "autostop" in record.message, record.message
    assert record.chain_ended and "autostop" in record.chain_ended and record.next_allocation_id is None
    first = record.allocations[0]
    assert "autostop" in first.reason
    # Not before the timeout: from the plain job's end to the allocation's end.
    assert first.ended - mon["plain"][1] >= IDLE_TIMEOUT, (first, mon["plain"])
    assert first.ended - mon["plain"][1] <= IDLE_TIMEOUT + 30
    # Nothing of the chain is left in SLURM, and every view says why.
    wait_until(
        lambda: not any(n == f"raystack-{NAME}" for _j, n in slurm_jobs_alive(True)),
        60,
        "the allocation and its pending follow-on to leave SLURM",
    )
    assert "autostop" in raystack("status", NAME).stdout
    assert "autostop" in raystack("list").stdout
    assert any("autostop" in h["message"] for h in record.history if h["state"] == "STOPPED")
    refused = raystack("submit", str(JOBS / "hello.yaml"), "--cluster", NAME)
    assert refused.returncode == 1 and "STOPPED" in refused.stderr


def test_report_after_the_end_matches_the_jobs_own_clocks(mon: dict) -> None:
    cache = mon["home"].parent / "cache"  # (a reader writes into the user's cache, never the cluster folder)
    out = raystack("report", NAME, "--json", env={"XDG_CACHE_HOME": str(cache)})
    assert out.returncode == 0, out.stderr + out.stdout
    report = json.loads(out.stdout)
    record = clusters.read(NAME)
    alloc = record.allocations[0]
    log = (mon["home"] / "clusters" / NAME / "logs" / "jobs" / f"{mon['burn']}.log").read_text()
    burn = {
        m["burn"]: m["t"] for m in (json.loads(ln) for ln in log.splitlines() if ln.startswith('{"burn"'))
    }
    busy = (burn["end"] - burn["start"]) + (mon["plain"][1] - mon["plain"][0])
    idle = (alloc.ended - alloc.ready) - busy
    assert abs(report["idle_s"] - idle) <= 0.1 * idle, (report["idle_s"], idle, report)
    assert report["held_s"] == pytest.approx(alloc.ended - alloc.started, abs=1)
    assert report["node_hours"] == pytest.approx(2 * report["held_s"] / 3600, abs=0.01)
    assert report["startup_s"] + report["busy_s"] + report["idle_s"] == pytest.approx(report["held_s"], abs=1)
    assert report["samples"] >= 2 * 0.8 * (alloc.ended - alloc.ready) / 2  # every 2 s, both nodes
    png = Path(report["png"])
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    assert png == cache / "raystack" / "reports" / f"{NAME}.png"
    # One job's report: the worker node ran about one core for it.
    one = json.loads(raystack("report", NAME, "--job", mon["burn"], "--json").stdout)
    worker = next(n for n in one["per_node"] if n["host"] != record.head_host)
    assert worker["cores_busy"] >= 0.6, one["per_node"]
    assert one["job_s"] == pytest.approx(burn["end"] - burn["start"], abs=6)
    if os.environ.get("RAYSTACK_KEEP_PNG"):
        shutil.copy(png, os.environ["RAYSTACK_KEEP_PNG"])
