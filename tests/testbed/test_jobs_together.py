"""Jobs as researchers write them, on a real 4-node cluster: jobs side by side on nodes of their
own, sweeps, dependencies, and Ray's runtime_env (py_modules, pip from a local wheel folder on
nodes that cannot reach a package index). One cluster serves the module."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.client import Job
from raystack.store import cluster as clusters
from raystack.store.ledger import JobRecord, JobState

from ..allocation.test_packing import wheel
from ..conftest import NODES, module_home, wait_until
from .test_cluster import raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
DEBUG = Path(__file__).resolve().parents[2] / "jobs" / "debug"


@pytest.fixture(scope="module")
def jt(testbed: Path) -> Iterator[dict]:
    with module_home(testbed, "together") as home:
        cluster = Cluster.up(NODES, profile="testbed", name="jt", timeout=240)
        yield {"cluster": cluster, "home": home}
        if not clusters.read("jt").state.is_terminal():
            cluster.down()


def spread(job: Job) -> dict:
    line = next(ln for ln in job.logs().splitlines() if ln.startswith("SPREAD "))
    return json.loads(line.removeprefix("SPREAD "))


def done(jobs: list[Job], timeout: float = 300) -> list[JobRecord]:
    return [job.wait(timeout=timeout) for job in jobs]


def submit_spread(cluster: Cluster, *args: str, sets: list[str]) -> Job:
    return cluster.submit(["python", "spread.py", *args], sets=[f"working_dir={DEBUG}", *sets])


def test_four_one_node_jobs_run_at_once_each_on_a_node_and_gpus_of_its_own(jt: dict) -> None:
    cluster: Cluster = jt["cluster"]
    jobs = [
        submit_spread(
            cluster, "--actors", "4", "--gpus", "1", "--hold", "6", sets=[f"name=one{i}", "needs.nodes=1"]
        )
        for i in range(4)
    ]
    records = done(jobs)
    assert [r.state for r in records] == [JobState.SUCCEEDED] * 4, [r.message for r in records]
    found = [spread(job) for job in jobs]
    nodes = [{a["node"] for a in f["actors"]} for f in found]
    assert all(len(n) == 1 for n in nodes), nodes  # each job's 4 actors on its one node
    assert len(set().union(*nodes)) == 4  # and the four jobs on four different nodes
    for f in found:
        assert sorted(g for a in f["actors"] for g in a["gpus"]) == ["0", "1", "2", "3"]
        assert {a["ip"] for a in f["actors"]} == set(f["nodes"].split(","))
    starts, ends = [f["start"] for f in found], [f["end"] for f in found]
    assert max(starts) < min(ends), "the four jobs did not run at the same time"


def test_two_two_node_jobs_cannot_touch_each_others_nodes(jt: dict) -> None:
    cluster: Cluster = jt["cluster"]
    a = submit_spread(
        cluster, "--actors", "8", "--gpus", "1", "--hold", "4", sets=["name=halfa", "needs.nodes=2"]
    )
    b = submit_spread(
        cluster, "--actors", "8", "--gpus", "1", "--pg", "--hold", "4", sets=["name=halfb", "needs.gpus=8"]
    )
    records = done([a, b])
    assert [r.state for r in records] == [JobState.SUCCEEDED] * 2, [r.message for r in records]
    fa, fb = spread(a), spread(b)
    nodes_a, nodes_b = {x["ip"] for x in fa["actors"]}, {x["ip"] for x in fb["actors"]}
    assert nodes_a == set(fa["nodes"].split(",")) and len(nodes_a) == 2
    assert nodes_b == set(fb["nodes"].split(",")) and len(nodes_b) == 2  # (its placement group too)
    assert not nodes_a & nodes_b
    assert max(fa["start"], fb["start"]) < min(fa["end"], fb["end"])


def test_a_job_that_declares_nothing_waits_for_the_packed_ones_and_runs_alone(jt: dict) -> None:
    cluster: Cluster = jt["cluster"]
    packed = submit_spread(cluster, "--actors", "1", "--hold", "8", sets=["name=small", "needs.nodes=1"])
    whole = submit_spread(cluster, "--actors", "16", "--gpus", "1", sets=["name=whole"])
    behind = submit_spread(cluster, "--actors", "1", sets=["name=behind", "needs.nodes=1"])
    p, w, b = done([packed, whole, behind])
    assert (p.state, w.state, b.state) == (JobState.SUCCEEDED,) * 3, (p.message, w.message, b.message)
    assert p.ended is not None and w.started is not None and w.started >= p.ended - 0.5
    assert (
        w.ended is not None and b.started is not None and b.started >= w.ended - 0.5
    )  # (no backfill past it)
    assert len({x["ip"] for x in spread(whole)["actors"]}) == NODES


def test_packed_jobs_that_never_call_ray_init_free_their_nodes_at_once(jt: dict) -> None:
    """Their submissions have no Ray job id: asking the State API about an empty one failed
    every runner pass until FREE_TIMEOUT (600 s), and nothing else started meanwhile."""
    cluster: Cluster = jt["cluster"]
    plain = [
        cluster.submit(["python", "-c", "print('plain')"], sets=[f"name=plain{i}", "needs.nodes=1"])
        for i in range(2)
    ]
    whole = cluster.submit(["python", "-c", "print('whole')"], sets=["name=afterplain"])
    records = done([*plain, whole], timeout=120)
    assert [r.state for r in records] == [JobState.SUCCEEDED] * 3, [r.message for r in records]
    log = cluster.paths.runner_log.read_text()
    assert "ID string needs to have length" not in log


def test_stop_of_a_sweep_stops_its_running_jobs_and_cancels_the_queued_ones(jt: dict) -> None:
    """As scancel of an array job: `raystack stop SWEEP` (it refused a sweep's id before)."""
    cluster: Cluster = jt["cluster"]
    jobs = cluster.submit_jobs(
        ["python", "-c", "import time; time.sleep(300)"],
        sets=["name=long", "needs.nodes=1"],
        sweeps=[f"env.K={','.join(str(k) for k in range(NODES + 1))}"],
    )
    sweep = (jobs[0].seen or jobs[0].record()).request.sweep
    wait_until(lambda: sum(j.record().state is JobState.RUNNING for j in jobs) == NODES, 120, "the sweep")
    started = time.monotonic()
    done = raystack("stop", str(sweep), "--json")
    assert done.returncode == 0, done.stderr
    states = [r["state"] for r in json.loads(done.stdout)]
    assert sorted(states) == ["CANCELLED"] + ["STOPPED"] * NODES, states
    assert [j.record().state.value for j in jobs] == states  # (in the sweep's order)
    assert time.monotonic() - started < 60


def test_a_sweep_with_one_failing_job_and_an_afterok_chain(jt: dict) -> None:
    cluster: Cluster = jt["cluster"]
    sweep = cluster.submit_jobs(
        ["python", "spread.py", "--actors", "1", "--fail-if", "BAD"],
        sets=[f"working_dir={DEBUG}", "needs.nodes=1", "name=train"],
        sweeps=["env.BAD=no,no,yes,no,no,no"],
    )
    sweep_id = (sweep[0].seen or sweep[0].record()).request.sweep
    assert sweep_id
    ok = cluster.submit_jobs(["python", "-c", "print('eval')"], sets=["name=eval"], after=[sweep_id])[0]
    anyway = cluster.submit_jobs(
        ["python", "-c", "print('report')"], sets=["name=report"], after=[f"{sweep_id}:any"]
    )[0]
    first = cluster.submit(["python", "-c", "raise SystemExit(2)"], sets=["name=first"])
    then = cluster.submit_jobs(["python", "-c", "print('then')"], sets=["name=then"], after=[first.id])[0]
    other = cluster.submit_jobs(
        ["python", "-c", "print('fix')"], sets=["name=fix"], after=[f"{first.id}:notok"]
    )[0]
    records = done([*sweep, ok, anyway, first, then, other])
    states = [r.state for r in records[:6]]
    assert states.count(JobState.FAILED) == 1 and states.count(JobState.SUCCEEDED) == 5
    assert sorted(r.request.env["BAD"] for r in records[:6]) == ["no"] * 5 + ["yes"]
    assert records[6].state is JobState.CANCELLED and "can never be met" in records[6].message
    assert records[7].state is JobState.SUCCEEDED  # (afterany: the sweep ended, however)
    assert records[8].state is JobState.FAILED
    assert (
        records[9].state is JobState.CANCELLED and f"dependency {first.id} ended FAILED" in records[9].message
    )
    assert records[10].state is JobState.SUCCEEDED


def test_runtime_envs_the_nodes_cannot_make_fail_in_one_line(jt: dict) -> None:
    """An index the nodes cannot reach, no conda, no such python: FAILED in seconds with the fix,
    not after Ray's setup timeout (a pip environment that can be made: the test below)."""
    cluster: Cluster = jt["cluster"]
    t0 = time.time()
    bad = cluster.submit(
        ["python", "-c", "import requests"], sets=["name=noindex", "runtime_env={pip: [requests]}"]
    )
    no_conda = cluster.submit(
        ["python", "-c", "print(1)"], sets=["name=noconda", "runtime_env={conda: myenv}"]
    )
    record = bad.wait(timeout=120)
    assert record.state is JobState.FAILED and "cannot reach the package index" in record.message, (
        record.message
    )
    no_python = cluster.submit(
        ["python", "-V"], sets=["name=nopython", "runtime_env={py_executable: /no/python}"]
    )
    record = no_python.wait(timeout=120)  # (not PENDING in Ray for its 15-minute start timeout)
    assert record.state is JobState.FAILED and "/no/python is not a program on the nodes" in record.message
    record = no_conda.wait(timeout=120)
    if not (shutil.which("conda") or os.environ.get("CONDA_EXE") or os.environ.get("RAY_CONDA_HOME")):
        assert record.state is JobState.FAILED, record.message  # (not Ray's traceback: the fix)
        assert record.message.startswith("runtime_env conda: no conda on the nodes"), record.message
    assert time.time() - t0 < 90  # (not Ray's 10-minute setup timeout)


def test_py_modules_and_pip_from_local_wheels_are_made_on_every_node_while_the_job_before_runs(
    jt: dict,
) -> None:
    """Issue 43: the next job's runtime_env (py_modules, pip from a local wheel folder on nodes that
    cannot reach an index) is made on every node while the job before it runs: its setup is no
    longer dead time between the two."""
    cluster: Cluster = jt["cluster"]
    home: Path = jt["home"]
    wheels = home / "wheels"
    wheel(wheels, "rstiny", "0.1")
    lib = home / "lib" / "rsmod"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("WORD = 'from py_modules'\n")
    go = home / "prep-go"
    hold = cluster.submit(
        ["python", "-c", f"import os, time\nwhile not os.path.exists('{go}'): time.sleep(0.05)"],
        sets=["name=prephold", "timeout=400"],
    )
    renv = (
        f"runtime_env={{py_modules: [{lib}], pip: {{packages: [rstiny], "
        f"pip_install_options: [--no-index, --find-links={wheels}]}}}}"
    )
    # (and Ray's modules in the pip environment byte-compiled: Ray copies a virtualenv without its
    # .pyc files, and under PYTHONDONTWRITEBYTECODE=1 every process there compiled Ray again)
    code = (
        "import importlib.util as u, os, ray, rstiny, rsmod; "
        "print('RENV', rstiny.VALUE, rsmod.WORD, os.path.exists(u.cache_from_source(ray.__file__)))"
    )
    good = cluster.submit(["python", "-c", code], sets=["name=renv", renv])
    prepared = str(wait_until(lambda: good.record().prepared, 300, "the pip job prepared"))
    assert good.record().state is JobState.QUEUED  # (made while the hold job ran)
    assert prepared.startswith(f"py_modules, pip ready on {NODES} node(s) in "), prepared
    took = float(prepared.rsplit(" in ", 1)[1].rstrip("s"))
    shown = raystack("job", good.id, "--json")
    assert json.loads(shown.stdout)["prepared"] == prepared, shown.stderr
    go.write_text("")
    before, record = hold.wait(timeout=120), good.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.message + good.logs()[-2000:]
    assert "RENV 42 from py_modules True" in good.logs()
    running = record.time_in(JobState.RUNNING)
    assert before.ended and running and record.gap and record.gap["after"] == before.id
    # (the setup alone took `took` seconds on the nodes; the start found it made)
    assert running - before.ended < min(5.0, took), (running - before.ended, took, record.gap)
    api = cluster.dashboard()
    wait_until(
        lambda: not [j for j in api.list_jobs() if str(j.submission_id).startswith("raystack-prepare-")],
        30,
        "the throwaway preparation job deleted from Ray's list",
    )
