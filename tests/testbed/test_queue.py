"""The persistent queue on a real 4-node cluster: order, failures, stop, runner restarts, debug jobs.

One cluster serves the whole module; its first three jobs are queued before it is READY.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.adapters.allocator import allocator
from raystack.client import Job
from raystack.errors import ClusterError
from raystack.store import cluster as clusters
from raystack.store import paths, queue
from raystack.store.cluster import ClusterState
from raystack.store.ledger import JobRecord, JobState

from ..conftest import NODES, module_home, processes_of_job, wait_until
from .test_cluster import ray_job_submit, raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]
DEBUG = REPO / "jobs" / "debug"


def py(code: str) -> list[str]:
    """A bare-command job running a line of Python."""
    return ["python", "-c", code]


@pytest.fixture(scope="module")
def qc(testbed: Path) -> Iterator[dict]:
    with module_home(testbed, "queue") as home:
        cluster = Cluster.up(NODES, profile="testbed", name="qc", wait=False)
        early = []
        for i in range(3):
            job = cluster.submit(
                py(f"import time; print('early job {i}'); time.sleep(0.5)"), sets=[f"name=early{i}"]
            )
            early.append((job, clusters.read("qc").state))
        cluster.wait_ready(timeout=180)
        yield {"cluster": cluster, "early": early, "home": home}
        if not clusters.read("qc").state.is_terminal():
            cluster.down()


def finished(job: Job, timeout: float = 240) -> JobRecord:
    return job.wait(timeout=timeout)


def marker(job: Job, prefix: str) -> dict:
    line = next(ln for ln in job.logs().splitlines() if ln.startswith(prefix + " "))
    return json.loads(line.removeprefix(prefix + " "))


def test_jobs_queued_before_ready_run_in_order_and_never_overlap(qc: dict) -> None:
    jobs = [job for job, _ in qc["early"]]
    assert all(state is not ClusterState.READY for _, state in qc["early"]), "queued too late"
    records = [finished(job) for job in jobs]
    assert [r.state for r in records] == [JobState.SUCCEEDED] * 3
    for i, (job, record) in enumerate(zip(jobs, records, strict=True)):
        assert f"early job {i}" in job.logs()
        assert record.attempt_ids == [record.id]
    for before, after in itertools.pairwise(records):
        assert before.ended is not None and after.started is not None
        assert before.ended <= after.started, f"{before.id} overlaps {after.id}"
        queued = after.time_in(JobState.QUEUED)
        assert queued is not None and queued <= before.started  # all were waiting together


def test_debug_jobs_hello_allreduce_zero3_succeed(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    hello, allreduce, zero3 = (cluster.submit(DEBUG / f"{n}.yaml") for n in ("hello", "allreduce", "zero3"))
    for job in (hello, allreduce, zero3):
        record = finished(job, timeout=420)
        assert record.state is JobState.SUCCEEDED, f"{job.id}: {record.message}\n{job.logs()[-3000:]}"
    info = marker(hello, "HELLO")
    assert info["nodes"] == NODES and info["gpus"] == NODES * 4
    assert sorted(n["host"] for n in info["per_node"]) == [f"node{i}" for i in range(1, NODES + 1)]
    reduce = marker(allreduce, "ALLREDUCE")
    assert reduce["all_ok"] and reduce["world"] == NODES and len(reduce["hosts"]) == NODES
    assert reduce["backend"] == "gloo" and reduce["busbw_gb_s"] > 0
    z3 = marker(zero3, "ZERO3")
    assert z3["matches_reference"] and z3["max_rel_error"] <= 1e-3
    assert z3["sharded"] and len(z3["hosts"]) == z3["world"] == NODES


def test_gpus_stay_masked_when_the_driver_forwards_its_environment(qc: dict) -> None:
    """open-instruct's pattern: ray.init(runtime_env={"env_vars": dict(os.environ)}). Through
    raystack every actor sees only its own GPU; through plain `ray job submit` (Ray's driver
    environment forwarded as is) every actor sees every GPU of its node."""
    job = qc["cluster"].submit(DEBUG / "placement.yaml")
    record = finished(job)
    assert record.state is JobState.SUCCEEDED, job.logs()[-3000:]
    info = marker(job, "PLACEMENT")
    assert info["ok"] and info["learners"] == NODES and info["engines"] == NODES * 3
    assert all(len(a["cuda_visible_devices"].split(",")) == 1 for a in info["actors"])
    assert info["driver_cuda_visible_devices"] == "0,1,2,3" and info["driver_noset"] is None
    plain = ray_job_submit("qc", DEBUG, "python", "placement.py")
    assert plain.returncode != 0  # the same job, the same cluster, without raystack's driver prefix
    assert "sees ['0', '1', '2', '3']" in plain.stdout


def test_failing_job_is_recorded_and_the_next_still_runs(qc: dict) -> None:
    follow = raystack(
        "submit",
        "--cluster",
        "qc",
        "--follow",
        "--",
        "python",
        "-c",
        "import sys; print('about to fail'); sys.exit(3)",
    )
    assert "queued job" in follow.stderr, follow.stderr
    assert follow.returncode == 1  # --follow exits with the job's outcome
    assert "about to fail" in follow.stdout
    assert "FAILED" in follow.stderr
    failed = [r for r in Cluster("qc").jobs() if r.state is JobState.FAILED][-1]
    assert failed.exit_code == 3 and "exit code 3" in failed.message.lower()
    killed = qc["cluster"].submit(py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    nxt = qc["cluster"].submit(py("print('after the failure')"))
    # (a driver SIGKILLed, as the OOM killer does: the shell's 137 is said as what it means)
    message = finished(killed).message
    assert message.startswith("exit code 137 (killed by SIGKILL, most often the out-of-memory killer)"), (
        message
    )
    assert finished(nxt).state is JobState.SUCCEEDED


def test_a_driver_no_node_can_hold_fails_and_the_queue_goes_on(qc: dict) -> None:
    """Before: --entrypoint-memory over any node's memory stayed SUBMITTED for ever, its stop
    unheard (Ray's stop waits for a job supervisor that never starts), and held the queue."""
    cluster: Cluster = qc["cluster"]
    big = cluster.submit(
        py("print('never')"), sets=["name=big", "entrypoint_memory=4000G", "infeasible_grace=5s"]
    )
    nxt = cluster.submit(py("print('after the big one')"))
    record = finished(big, timeout=120)
    assert record.state is JobState.FAILED and record.message.startswith("infeasible: the driver wants {"), (
        record
    )
    assert "memory: 3.91TiB" in record.message
    assert finished(nxt).state is JobState.SUCCEEDED


def test_stop_running_job_within_grace_and_resume_from_checkpoint(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    ckpt = qc["home"] / "resume-ckpt"
    sets = [f"outputs.checkpoints={ckpt}", "stop_grace=10s"]
    long = cluster.submit(
        DEBUG / "resume.yaml", sets=[*sets, "entrypoint=python resume.py --steps 1000 --step-seconds 0.2"]
    )
    after = cluster.submit(py("print('next after stop')"))
    wait_until(
        lambda: (ckpt / "state.json").exists() and json.loads((ckpt / "state.json").read_text())["step"] >= 3,
        120,
        "the counter to checkpoint a few steps",
    )
    assert after.state is JobState.QUEUED
    stopped = long.stop()
    assert stopped.state is JobState.STOPPED, stopped.message
    assert stopped.ended is not None and stopped.stop_requested is not None
    assert stopped.ended - stopped.stop_requested < 10 + 5  # within its stop_grace
    assert "stopped at step" in long.logs()  # SIGTERM reached the job, which saved its state
    saved = json.loads((ckpt / "state.json").read_text())["step"]
    assert finished(after).state is JobState.SUCCEEDED
    # The same job again continues from the checkpoint instead of starting over.
    again = cluster.submit(
        DEBUG / "resume.yaml",
        sets=[*sets, f"entrypoint=python resume.py --steps {saved + 3} --step-seconds 0.1"],
    )
    assert finished(again).state is JobState.SUCCEEDED
    assert f"starting at step {saved} (run 2," in again.logs()
    assert f"RESUME done at step {saved + 3} after 2 run(s)" in again.logs()


def test_retry_after_failure_and_timeout(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    flag = qc["home"] / "flaky-flag"
    flaky = cluster.submit(
        py(
            f"import os, sys; p = {str(flag)!r}; ok = os.path.exists(p); open(p, 'a').close(); "
            "print('attempt ok' if ok else 'attempt fails'); sys.exit(0 if ok else 1)"
        ),
        sets=["name=flaky", "retries=2"],
    )
    record = finished(flaky)
    assert record.state is JobState.SUCCEEDED
    assert record.attempt_ids == [flaky.id, f"{flaky.id}-retry1"]  # retried once, not twice
    log = flaky.logs()
    assert "--- raystack: attempt 1" in log and "attempt fails" in log and "attempt ok" in log
    slow = cluster.submit(
        py("import time; time.sleep(600)"), sets=["name=slow", "timeout=3s", "stop_grace=1s"]
    )
    record = finished(slow)
    assert record.state is JobState.FAILED and "timed out after 3s" in record.message


def test_runner_killed_mid_queue_restarts_and_runs_every_job_once(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    trace = qc["home"] / "runs.txt"
    code = (
        f"import os, time; open({str(trace)!r}, 'a').write(os.environ['RAYSTACK_JOB_ID'] + '\\n'); "
        "time.sleep(2)"
    )
    jobs = [cluster.submit(py(code), sets=[f"name=once{i}"]) for i in range(3)]
    wait_until(lambda: jobs[0].state is JobState.RUNNING, 120, "the first job to run")
    before = clusters.read("qc")
    # runner_pid is the PID inside node1's PID namespace: find the runner from the host instead.
    [runner] = [
        pid
        for pid, cmd in processes_of_job(str(before.allocation_id))
        if "-m raystack.allocation.runner qc" in cmd
    ]
    os.kill(runner, signal.SIGKILL)
    wait_until(lambda: clusters.read("qc").runner_restarts > before.runner_restarts, 30, "a new runner")
    records = [finished(job) for job in jobs]
    assert [r.state for r in records] == [JobState.SUCCEEDED] * 3
    assert sorted(trace.read_text().split()) == sorted(j.id for j in jobs)  # each ran exactly once
    assert all(r.attempt_ids == [r.id] for r in records)
    submitted = [j.metadata.get("raystack_job") for j in Cluster("qc").dashboard().list_jobs() if j.metadata]
    assert all(submitted.count(j.id) == 1 for j in jobs)


def test_cancel_removes_a_queued_job_before_it_reaches_ray(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    first = cluster.submit(py("import time; time.sleep(3)"))
    second = cluster.submit(py("print('never')"))
    done = raystack("cancel", second.id, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "CANCELLED"
    assert finished(first).state is JobState.SUCCEEDED
    assert second.state is JobState.CANCELLED and Cluster("qc").dashboard().info(second.id) is None
    again = raystack("cancel", first.id)
    assert (
        again.returncode == 1 and f"job {first.id} has ended (SUCCEEDED): nothing to cancel" in again.stderr
    )


def test_now_skips_the_queue_and_status_shows_the_running_job(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    long = cluster.submit(py("import time; time.sleep(600)"), sets=["name=long", "stop_grace=2s"])
    queued = cluster.submit(py("print('waits')"), sets=["name=waiting"])
    wait_until(lambda: long.state is JobState.RUNNING, 120, "the long job to run")
    st = json.loads(raystack("status", "qc", "--json").stdout)
    assert st["running_job"] == long.id and st["queued_jobs"] == 1
    assert f"running {long.id}, 1 queued" in raystack("status", "qc").stdout
    quick = raystack(
        "submit", "--cluster", "qc", "--now", "--follow", "--", "python", "-c", "print('jumped the queue')"
    )
    assert quick.returncode == 0, quick.stderr
    assert "jumped the queue" in quick.stdout
    assert long.state is JobState.RUNNING and queued.state is JobState.QUEUED
    assert long.stop().state is JobState.STOPPED
    assert finished(queued).state is JobState.SUCCEEDED


def test_plain_ray_job_submit_works_beside_the_queue(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    queued = cluster.submit(py("import time; time.sleep(2); print('queued one')"))
    workdir = qc["home"] / "plain"
    workdir.mkdir(exist_ok=True)
    (workdir / "plain.py").write_text("print('plain job ran')\n")
    done = ray_job_submit("qc", workdir, "python", "plain.py")
    assert done.returncode == 0 and "plain job ran" in done.stdout
    assert finished(queued).state is JobState.SUCCEEDED


def test_bad_spec_against_the_live_cluster_loses_nothing(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    running = cluster.submit(py("import time; time.sleep(3); print('survived')"))
    before = {r.id for r in cluster.jobs()}
    done = raystack(
        "submit", "--cluster", "qc", str(DEBUG / "hello.yaml"), "--set", f"needs.gpus={NODES * 4 + 1}"
    )
    assert done.returncode == 1 and f"needs.gpus={NODES * 4 + 1} but cluster 'qc'" in done.stderr
    assert {r.id for r in cluster.jobs()} == before
    assert finished(running).state is JobState.SUCCEEDED and "survived" in running.logs()


def test_a_package_the_default_excludes_left_out_is_named_at_submit_and_in_the_failure(
    qc: dict, tmp_path: Path
) -> None:
    """An RL repo whose environments live in env/ (a name raystack's default excludes keep off
    the nodes, with virtualenvs): submit says so, the job's failure names it and the fix, and
    the fix runs it."""
    repo = tmp_path / "rl"
    (repo / "env").mkdir(parents=True)
    (repo / "env" / "__init__.py").write_text("class Grid:\n    size = 4\n")
    (repo / "train.py").write_text("from env import Grid\nprint('grid', Grid.size)\n")
    (repo / "job.yaml").write_text("name: rl\nworking_dir: .\nentrypoint: python train.py\n")
    done = raystack("submit", str(repo / "job.yaml"), "--cluster", "qc", "--follow")
    assert done.returncode == 1
    assert "note: not uploaded (raystack's default excludes): env/; a job that needs one: add '!env/'" in (
        done.stderr
    ), done.stderr
    failed = [r for r in Cluster("qc").jobs() if r.name == "rl"][-1]
    assert failed.state is JobState.FAILED
    assert failed.message.endswith(
        "No module named 'env' (env/ was not uploaded: raystack's default excludes leave out env/; "
        "add '!env/' to its excludes)"
    ), failed.message
    fixed = raystack("submit", str(repo / "job.yaml"), "-c", "qc", "--set", 'excludes=["!env/"]', "-f")
    assert fixed.returncode == 0 and "grid 4" in fixed.stdout, fixed.stderr
    assert "not uploaded" not in fixed.stderr


def test_queue_survives_faults(qc: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """20 jobs; meanwhile the runner is SIGKILLed twice, junk lands in the queue folder, a job is
    cancelled just as its turn comes, and squeue fails once for the client. Afterwards every job
    ran at most once, every ledger is final and says what happened, and nothing stalled."""
    cluster: Cluster = qc["cluster"]
    p = paths.cluster("qc")
    trace = qc["home"] / "fault-trace.txt"
    code = (
        f"import os, time; open({str(trace)!r}, 'a').write(os.environ['RAYSTACK_JOB_ID'] + '\\n'); "
        "time.sleep(0.3)"
    )
    t0 = time.monotonic()
    jobs = [cluster.submit(py(code), sets=[f"name=fault{i}"]) for i in range(20)]
    # squeue fails once (a shim first on the client's PATH): the live cluster must stay live.
    shim, flag = tmp_path / "shim", tmp_path / "squeue-failed"
    shim.mkdir()
    (shim / "squeue").write_text(
        f"#!/bin/bash\nif [ ! -e {flag} ]; then touch {flag}\n"
        "echo 'squeue: error: Socket timed out on send/recv operation' >&2; exit 1; fi\n"
        f'exec {shutil.which("squeue")} "$@"\n'
    )
    (shim / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    allocator("slurm").forget()
    assert Cluster("qc").record().state is ClusterState.READY and flag.exists()
    assert Cluster("qc").status().ready
    # Junk in the queue folder: a stray file and an entry whose ledger does not exist.
    (p.queue / "notes.txt").write_text("not a job")
    (p.queue / f"1{time.time_ns():020d}-ghost-00000000").touch()
    kills = 0
    for victim in (jobs[3], jobs[10]):
        wait_until(lambda v=victim: v.state is not JobState.QUEUED, 180, f"{victim.id} to start")
        before = clusters.read("qc").runner_restarts
        [runner] = [
            pid
            for pid, cmd in processes_of_job(str(clusters.read("qc").allocation_id))
            if "-m raystack.allocation.runner qc" in cmd
        ]
        os.kill(runner, signal.SIGKILL)
        kills += 1
        wait_until(lambda b=before: clusters.read("qc").runner_restarts > b, 60, "the runner to restart")
    # Cancel jobs[15] just as its turn comes: either the cancel or the start wins, never both.
    wait_until(lambda: jobs[14].state.is_terminal(), 180, "job 14 to end")
    try:
        jobs[15].cancel()
    except ClusterError as exc:
        assert "not queued" in str(exc) or "has ended" in str(exc)  # (started; or done already)
    records = [finished(job, timeout=300) for job in jobs]
    elapsed = time.monotonic() - t0
    ran = trace.read_text().split()
    outcome = {"ran": 0, "cancelled": 0}
    for record in records:
        if record.state is JobState.SUCCEEDED:
            assert ran.count(record.id) == 1, record.id
            outcome["ran"] += 1
        else:
            assert record.state is JobState.CANCELLED and ran.count(record.id) == 0, record
            outcome["cancelled"] += 1
    assert outcome["cancelled"] <= 1 and outcome["ran"] >= 19
    assert len(ran) == len(set(ran)) == outcome["ran"]  # nothing ran twice, nothing else ran
    # The ghost entry sorts last: the runner reaches (and drops) it once the line is free; a
    # stray file is left where it is (nothing is moved that is not a job's unreadable ledger).
    wait_until(lambda: not any("ghost" in x.name for x in p.queue.iterdir()), 60, "the ghost entry dropped")
    assert (p.queue / "notes.txt").read_text() == "not a job" and not p.corrupt.exists()
    assert queue.waiting("qc") == [] and queue.active("qc") == []
    report = {**outcome, "runner_kills": kills, "squeue_failures": 1, "seconds": round(elapsed, 1)}
    print(f"FAULTS {json.dumps(report)}")


def test_a_worker_whose_raylet_is_killed_rejoins_and_whole_cluster_jobs_run(qc: dict) -> None:
    """Before: a worker's raylet SIGKILLed (as the OOM killer does) made its node program leave; the
    cluster stayed at NODES-1 nodes until the walltime, SLURM holding the node idle."""
    cluster: Cluster = qc["cluster"]
    record = clusters.read("qc")
    head_ip = str(record.gcs_address).rsplit(":", 1)[0]
    [(victim, ip)] = [
        (pid, ip)
        for pid, cmd in processes_of_job(str(record.allocation_id))
        if "/raylet " in f"{cmd.split()[0]} "
        and (ip := cmd.split("--node_ip_address=")[1].split()[0]) != head_ip
    ][-1:]
    os.kill(victim, signal.SIGKILL)
    logs = list(cluster.paths.logs.glob("node-*.log"))
    wait_until(
        lambda: any("while the head lives; it rejoins" in log.read_text() for log in logs), 60, "a rejoin"
    )
    wait_until(
        lambda: any(
            pid != victim and f"--node_ip_address={ip} " in f"{cmd} " and "/raylet " in f"{cmd.split()[0]} "
            for pid, cmd in processes_of_job(str(record.allocation_id))
        ),
        60,
        f"a new raylet on {ip}",
    )
    wait_until(lambda: Cluster("qc").status().nodes_alive == NODES, 120, f"{NODES} nodes alive")
    code = "import ray; ray.init(); print('ALIVE', len({n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']}))"  # noqa: E501
    job = cluster.submit(py(code), sets=["name=whole", "needs.nodes=" + str(NODES)])
    assert finished(job).state is JobState.SUCCEEDED, job.record().message
    assert f"ALIVE {NODES}" in job.logs()


def test_logs_and_ledger_outlive_the_allocation(qc: dict) -> None:
    cluster: Cluster = qc["cluster"]
    cluster.down()
    first = qc["early"][0][0]
    done = raystack("logs", first.id)
    assert done.returncode == 0 and "early job 0" in done.stdout
    as_json = json.loads(raystack("logs", first.id, "--json").stdout)
    assert as_json["state"] == "SUCCEEDED" and "early job 0" in as_json["log"]
    assert raystack("logs", first.id, "-f").returncode == 0
    failed = next(r for r in cluster.jobs() if r.state is JobState.FAILED)
    assert raystack("logs", failed.id, "--follow").returncode == 1
    table = json.loads(raystack("queue", "qc", "--json").stdout)
    assert {row["state"] for row in table} <= {"SUCCEEDED", "FAILED", "STOPPED", "CANCELLED"}
    assert all(row["duration_s"] is not None for row in table if row["state"] == "SUCCEEDED")
