"""`raystack report`'s figures from a scripted cluster folder (no Ray): held = startup + busy +
idle, busy is the union of the jobs' runs (and other Ray jobs the head saw), GPU utilisation is
averaged over the busy samples, a chain's allocations add up, and the PNG is drawn. The same on
a live cluster: tests/testbed/test_monitor.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raystack.client import report
from raystack.errors import ClusterError
from raystack.store import cluster as clusters
from raystack.store import paths
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRecord, JobRequest

T0 = 1_700_000_000.0


def job(job_id: str, *states: tuple[str, float], ended: float | None = None) -> JobRecord:
    request = JobRequest(id=job_id, name=job_id.split("-")[0], cluster="c", entrypoint="true")
    history = [{"state": s, "time": T0 + t, "message": ""} for s, t in states]
    return JobRecord(
        id=job_id,
        name=request.name,
        request=request,
        history=history,
        state=states[-1][0],
        ended=T0 + ended if ended else None,
    )


def samples(
    host: str,
    alloc: str,
    start: float,
    end: float,
    gpu: dict[tuple[float, float], float],
    other: tuple[float, float] | None = None,
    head: bool = False,
) -> None:
    """Samples every 10 s; GPU utilisation `gpu[(a, b)]` inside [a, b), else 0."""
    lines = []
    t = start
    while t <= end:
        util = next((u for (a, b), u in gpu.items() if a <= t < b), 0.0)
        line = {
            "t": T0 + t,
            "cpu": 10.0,
            "ours": 0.5,
            "mem": 2**30,
            "mem_total": 2**34,
            "gpus": [[util, 1000.0, 80000.0], [util, 2000.0, 80000.0]],
        }
        if head:
            line["other_jobs"] = 1 if other and other[0] <= t <= other[1] else 0
        lines.append(json.dumps(line))
        t += 10
    path = paths.cluster("c").usage_file(alloc, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + '\n{"t": 17')  # a torn last line (node killed mid-write)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    return tmp_path


def record(*allocations: dict) -> ClusterRecord:
    r = ClusterRecord(
        name="c",
        state=ClusterState.STOPPED,
        allocation_id="101",
        nodes_expected=2,
        allocations=list(allocations),
    )
    clusters.write(r)
    return r


def test_held_is_startup_plus_busy_plus_idle(home: Path) -> None:
    # held 0..1000 s, READY at 100; jobs 200-400 and 350-500 (overlap), 700-800; so busy 400 s
    rec = record({"alloc_id": "101", "started": T0, "ready": T0 + 100, "ended": T0 + 1000, "nodes": 2})
    jobs = [
        job("a-1", ("QUEUED", 0), ("SUBMITTED", 200), ("RUNNING", 210), ("SUCCEEDED", 400)),
        job("b-2", ("QUEUED", 0), ("SUBMITTED", 350), ("RUNNING", 360), ("FAILED", 500)),
        job("c-3", ("QUEUED", 0), ("SUBMITTED", 700), ("RUNNING", 705), ("SUCCEEDED", 800)),
        job("d-4", ("QUEUED", 0), ("CANCELLED", 50)),  # never ran: not in the figures
    ]
    for host in ("n1", "n2"):
        samples(host, "101", 0, 1000, {(200, 500): 80.0, (700, 800): 40.0}, head=host == "n1")
    r = report.summarize(rec, jobs, now=T0 + 5000)
    assert r["held_s"] == 1000 and r["startup_s"] == 100 and r["busy_s"] == 400 and r["idle_s"] == 500
    assert r["node_hours"] == pytest.approx(2000 / 3600, abs=1e-3)
    assert r["busy_node_hours"] == pytest.approx(800 / 3600, abs=1e-3)
    assert r["idle_node_hours"] == pytest.approx(1000 / 3600, abs=1e-3)
    assert r["busy_fraction"] == 0.4
    # busy samples: t = 200..500 (31 per node, 80% except t=500 -> 0) and 700..800 (11: 40%, t=800 -> 0)
    assert 60 < r["gpu_util_busy"] < 75 and r["gpu_util_idle"] == 0.0
    assert [j["id"] for j in r["jobs"]] == ["a-1", "b-2", "c-3"]
    assert r["jobs"][0]["run_s"] == 200 and r["jobs"][0]["gpu_util"] == 80.0
    assert {n["host"] for n in r["per_node"]} == {"n1", "n2"}
    assert r["per_node"][0]["gpu_mem_peak_mib"] == 3000.0
    assert r["samples"] == 2 * 101  # the torn line skipped

    one = report.summarize(rec, jobs, "c-3", now=T0 + 5000)
    assert one["job_s"] == 100 and one["gpu_util_busy"] == pytest.approx(40 * 10 / 11, abs=0.5)
    png = report.plot(one, rec, home / "out" / "c-3.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_other_ray_jobs_count_as_busy_and_a_chain_adds_up(home: Path) -> None:
    rec = record(
        {"alloc_id": "100", "started": T0, "ready": T0 + 50, "ended": T0 + 600, "nodes": 2},
        {"alloc_id": "101", "started": T0 + 700, "ready": T0 + 760, "ended": T0 + 1300, "nodes": 2},
    )
    # a job interrupted at the first allocation's end, resumed in the second
    jobs = [
        job(
            "long-1",
            ("QUEUED", 0),
            ("SUBMITTED", 100),
            ("RUNNING", 105),
            ("INTERRUPTED", 590),
            ("QUEUED", 590),
            ("SUBMITTED", 770),
            ("RUNNING", 775),
            ("SUCCEEDED", 1000),
        )
    ]
    samples("n1", "100", 0, 600, {}, other=(20, 60), head=True)  # a plain `ray job submit`: 20..60
    samples("n1", "101", 700, 1300, {}, head=True)
    r = report.summarize(rec, jobs, now=T0 + 5000)
    assert len(r["allocations"]) == 2 and r["held_s"] == 1200 and r["startup_s"] == 110
    # busy: 50..60 (other job, clipped at READY) + 100..590 + 770..1000
    assert r["busy_s"] == pytest.approx(10 + 490 + 230)
    assert r["other_ray_jobs"] == [[T0 + 50, T0 + 60]]
    assert r["idle_s"] == pytest.approx(1200 - 110 - 730)
    assert r["jobs"][0]["run_s"] == 490 + 230


def test_a_live_allocation_runs_until_now_and_bad_jobs_are_named(home: Path) -> None:
    rec = record({"alloc_id": "101", "started": T0, "ready": T0 + 10, "nodes": 2})
    rec = rec.model_copy(update={"state": ClusterState.READY})
    clusters.write(rec)
    jobs = [job("a-1", ("QUEUED", 0), ("SUBMITTED", 20), ("RUNNING", 21))]
    r = report.summarize(rec, jobs, now=T0 + 100)
    assert r["held_s"] == 100 and r["busy_s"] == 80 and r["allocations"][0]["live"]
    with pytest.raises(ClusterError, match="--job: no job 'zz'"):
        report.summarize(rec, jobs, "zz", now=T0 + 100)
    jobs.append(job("q-2", ("QUEUED", 0)))
    with pytest.raises(ClusterError, match="never ran"):
        report.summarize(rec, jobs, "q-2", now=T0 + 100)


def test_nothing_started_is_an_error(home: Path) -> None:
    rec = record()
    with pytest.raises(ClusterError, match="no allocation that started"):
        report.summarize(rec, [], now=T0)


def test_merge_and_clip() -> None:
    assert report.merge([(5, 6), (1, 3), (2, 4), (7, 7)]) == [(1, 4), (5, 6)]
    assert report.clip([(0, 10), (20, 30)], (5, 25)) == [(5, 10), (20, 25)]


def test_a_plot_on_a_full_disk_leaves_nothing_behind(home: Path, tmp_path: Path) -> None:
    """A full filesystem: the plot raises OSError (which `raystack report` says in one line, the
    figures whole), and leaves neither an empty PNG nor its part file; a written PNG is 0600."""
    import subprocess

    rec = record({"alloc_id": "101", "started": T0, "ready": T0 + 100, "ended": T0 + 1000, "nodes": 1})
    jobs = [job("a-1", ("QUEUED", 0), ("SUBMITTED", 200), ("RUNNING", 210), ("SUCCEEDED", 400))]
    samples("n1", "101", 0, 1000, {(200, 400): 80.0}, head=True)
    figures = report.summarize(rec, jobs, now=T0 + 5000)
    ok = report.plot(figures, rec, home / "out" / "ok.png")
    assert ok.stat().st_mode & 0o777 == 0o600
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True
    ).returncode:
        pytest.skip("no tmpfs can be mounted here")
    try:
        (full / "filler").write_bytes(b"\0" * 60_000)
        with pytest.raises(OSError):
            report.plot(figures, rec, full / "r.png")
        assert sorted(p.name for p in full.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)
