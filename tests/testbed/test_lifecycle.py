"""Cluster lifecycles on the testbed: sharing nodes, scancel, refusals, failures while starting."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.adapters import slurm
from raystack.client.status import runner_waiting
from raystack.store import cluster as clusters
from raystack.store import paths
from raystack.store.cluster import ClusterState
from raystack.store.ledger import JobState

from ..conftest import NODES, processes_of_job, slurm_jobs_alive, slurm_shims, wait_until
from .test_cluster import RESOURCES_JOB, ray_job_submit, raystack, resources_from

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]


def test_two_clusters_share_nodes_and_down_of_one_spares_the_other(rs_home: Path) -> None:
    """Both heads on node1 and both workers on node2: ports must not collide."""
    share = [
        "--nodes",
        "2",
        "--profile",
        "testbed",
        "--gpus-per-node",
        "2",
        "--sbatch=--nodelist=node1,node2",
    ]
    for name in ("a", "b"):
        done = raystack("up", *share, "--name", name, "--no-wait")
        assert done.returncode == 0, done.stderr
    a, b = Cluster("a"), Cluster("b")
    a.wait_ready(timeout=180)
    b.wait_ready(timeout=180)
    ra, rb = clusters.read("a"), clusters.read("b")
    assert ra.head_host == rb.head_host == "node1"
    assert set(ra.ports.values()).isdisjoint(rb.ports.values())
    workdir = rs_home / "job"
    workdir.mkdir()
    (workdir / "resources.py").write_text(RESOURCES_JOB)
    for name in ("a", "b"):
        done = ray_job_submit(name, workdir, "python", "resources.py")
        assert done.returncode == 0, done.stdout + done.stderr
        assert resources_from(done.stdout)["GPU"] == 4  # 2 nodes x 2 GPUs each, not the other's

    a.down()
    assert clusters.read("a").state is ClusterState.STOPPED
    assert processes_of_job(ra.allocation_id) == []
    assert b.status().ready
    done = ray_job_submit("b", workdir, "python", "resources.py")
    assert done.returncode == 0, done.stdout + done.stderr
    b.down()
    assert processes_of_job(rb.allocation_id) == []


def test_a_cluster_of_the_same_name_in_another_raystack_home_is_no_twin(rs_home: Path) -> None:
    """Two projects (two RAYSTACK_HOMEs) of one user may each have a cluster `grpo`. Before, the
    second `up` was refused and told to scancel the other project's allocation."""
    other = {"RAYSTACK_HOME": str(rs_home / "other-project")}
    one = [
        "up",
        "--nodes",
        "1",
        "--profile",
        "testbed",
        "--gpus-per-node",
        "1",
        "--name",
        "same",
        "--no-wait",
    ]
    try:
        for env in (None, other):
            done = raystack(*one, env=env)
            assert done.returncode == 0, done.stderr
        done = raystack("status", "same", "--json", env=other)
        theirs = json.loads(done.stdout)["allocation_id"]
        assert theirs != clusters.read("same").allocation_id
    finally:
        raystack("down", "same", env=other)
    # The same name in this home is still refused while its allocation lives.
    done = raystack(*one)
    assert done.returncode == 1 and "name 'same' is in use by a live cluster" in done.stderr, done.stderr


def test_scancel_ends_the_cluster_and_leaves_no_process(rs_home: Path) -> None:
    cluster = Cluster.up(2, profile="testbed", name="victim", timeout=180)
    job = clusters.read("victim").allocation_id
    assert job and processes_of_job(job)
    slurm.scancel(job)
    wait_until(lambda: cluster.record().state.is_terminal(), 60, "the record to turn terminal")
    record = cluster.record()
    assert record.state is ClusterState.STOPPED, record.message
    assert "cancelled by scancel" in record.message or "CANCELLED" in record.message
    wait_until(lambda: processes_of_job(job) == [], 30, f"every process of job {job} to end")
    assert raystack("status", "victim").returncode == 1


def test_a_cluster_whose_folder_is_removed_releases_its_nodes(rs_home: Path) -> None:
    """`rm -rf` of a running cluster's folder (by hand, a scratch purge): before, this one-node
    cluster held its node until the walltime, and no raystack command could find or stop it."""
    done = raystack(
        *("up", "--nodes", "1", "--profile", "testbed", "--gpus-per-node", "1", "--name", "purged"),
        env={"RAYSTACK_FOLDER_GRACE": "10"},  # (300 s by default)
    )
    assert done.returncode == 0, done.stderr
    job = str(clusters.read("purged").allocation_id)
    try:
        assert processes_of_job(job)
        root = paths.cluster("purged").root

        def purge() -> bool:  # (as `rm -rf` again: the live cluster may add a file while it runs)
            shutil.rmtree(root, ignore_errors=True)
            return not root.exists()

        wait_until(purge, 10, f"{root} to be removed")
        removed = time.monotonic()
        wait_until(lambda: job not in slurm_jobs_alive(), 90, f"SLURM job {job} to end")
        assert time.monotonic() - removed >= 10  # not before the grace
        wait_until(lambda: processes_of_job(job) == [], 30, f"every process of job {job} to end")
        assert not paths.cluster("purged").root.exists()  # nothing made it again
    finally:
        slurm.scancel(job)


def test_a_head_whose_gcs_dies_frees_its_nodes_and_its_job_resumes_at_the_next_up(rs_home: Path) -> None:
    """The GCS of a running cluster's head SIGKILLed (the OOM killer's usual victim on a busy head):
    before, the job in flight was FAILED, as if it had failed itself, and never ran again."""
    up = ("up", "--nodes", "1", "--profile", "testbed", "--gpus-per-node", "1", "--name", "gcs")
    done = raystack(*up)
    assert done.returncode == 0, done.stderr
    cluster = Cluster("gcs")
    alloc = str(clusters.read("gcs").allocation_id)
    try:
        code = "import os, time; time.sleep(0 if os.environ.get('RAYSTACK_RESUME') else 600); print('done')"
        job = cluster.submit([sys.executable, "-c", code], sets=["name=gcsjob"])
        wait_until(lambda: job.record().state is JobState.RUNNING, 60, "the job to run")
        gcs = [pid for pid, cmd in processes_of_job(alloc) if "gcs_server" in cmd]
        assert gcs, processes_of_job(alloc)
        os.kill(gcs[0], signal.SIGKILL)
        wait_until(lambda: alloc not in slurm_jobs_alive(), 60, f"SLURM job {alloc} to end")
        record = clusters.read("gcs")
        assert record.state is ClusterState.FAILED and "gcs_server killed by SIGKILL" in record.message
        assert job.record().state is JobState.INTERRUPTED, job.record().message
        assert "it resumes in the next allocation" in job.record().message
        done = raystack(*up)
        assert done.returncode == 0, done.stderr
        ended = job.wait(timeout=120)
        assert ended.state is JobState.SUCCEEDED and len(ended.attempts) == 2, ended.message
        assert "done" in job.logs()
    finally:
        raystack("down", "gcs")


DETACHED = """
import ray
ray.init()
@ray.remote(num_gpus=1)
class Holder:
    def ping(self):
        return 1
holder = Holder.options(name="holder", lifetime="detached").remote()
print(ray.get(holder.ping.remote()))
"""


def test_a_detached_actor_left_by_a_job_is_named_while_the_next_job_waits(rs_home: Path) -> None:
    """A job leaves a detached actor holding the only GPU: before, the next job sat QUEUED with no
    word in `status` or `queue` for 10 minutes (RAYSTACK_FREE_TIMEOUT), then waited in Ray."""
    done = raystack("up", "--nodes", "1", "--profile", "testbed", "--gpus-per-node", "1", "--name", "left")
    assert done.returncode == 0, done.stderr
    cluster = Cluster("left")
    try:
        leaves = cluster.submit([sys.executable, "-c", DETACHED], sets=["name=leaves"])
        gpu = "import ray; ray.init(); print(ray.get(ray.remote(num_gpus=1)(lambda: 'got it').remote()))"
        after = cluster.submit([sys.executable, "-c", gpu], sets=["name=after"])
        assert leaves.wait(timeout=120).state is JobState.SUCCEEDED
        wait_until(lambda: runner_waiting("left", clusters.read("left")), 90, "the wait to be told")
        said = str(runner_waiting("left", clusters.read("left")))
        assert said.startswith(f"the next job waits for job {leaves.id} to release what it holds (actor ")
        assert "(Holder named 'holder' in namespace '" in said and "ray kill-actor --name NAME" in said
        assert after.record().state is JobState.QUEUED
        assert "the next job waits for job" in raystack("status", "left").stdout
        assert "the next job waits for job" in raystack("queue", "left").stderr
        namespace = said.split("in namespace '")[1].split("'")[0]
        exports = json.loads(raystack("env", "left", "--json").stdout)
        ray_cli = str(Path(sys.executable).with_name("ray"))
        kill = [ray_cli, "kill-actor", "--name", "holder", "--namespace", namespace, "--force"]
        env = {**os.environ, **exports}
        killed = subprocess.run([*kill, "--no-restart"], capture_output=True, text=True, timeout=120, env=env)
        assert killed.returncode == 0, killed.stderr
        ended = after.wait(timeout=120)
        assert ended.state is JobState.SUCCEEDED and "got it" in after.logs(), ended.message
        assert runner_waiting("left", clusters.read("left")) is None
    finally:
        raystack("down", "left")


def test_allocation_refused_by_slurm_shows_slurms_message(rs_home: Path) -> None:
    done = raystack("up", "--nodes", str(NODES + 1), "--profile", "testbed", "--name", "huge")
    assert done.returncode == 1
    assert done.stderr.startswith("raystack: error: SLURM refused the allocation:")
    assert "Node count specification invalid" in done.stderr
    # SLURM's words name no number: sinfo's are added (the profile gave the counts, so none was read)
    assert f"; --nodes {NODES + 1}: partition testbed has {NODES} node(s) (sinfo)" in done.stderr
    assert done.stderr.strip().count("\n") == 0
    assert clusters.read("huge").state is ClusterState.FAILED
    done = raystack("up", "--nodes", "1", "--profile", "testbed", "--gpus-per-node", "5", "--name", "wide")
    assert done.returncode == 1 and "SLURM refused the allocation:" in done.stderr, done.stderr
    assert "; --gpus-per-node 5: partition testbed's nodes have 4 GPUs (sinfo); ask at most 4" in done.stderr
    # Without a profile raystack reads the partition's size from sinfo and says it first.
    done = raystack("up", "--nodes", str(NODES + 1), "--name", "huger")
    assert done.returncode == 1 and not clusters.exists("huger"), done.stderr
    assert (
        f"--nodes {NODES + 1}: partition testbed has {NODES} node(s) (sinfo); ask at most {NODES}"
        in done.stderr
    )
    # `Memory specification can not be satisfied` names no number either.
    done = raystack("up", "--nodes", "1", "--profile", "testbed", "--mem", "500G", "--name", "fat")
    assert done.returncode == 1 and "Memory specification can not be satisfied" in done.stderr, done.stderr
    assert (
        "; --mem 500G: partition testbed's nodes have 16000 MB (16G, sinfo); ask at most 16000M"
        in done.stderr
    )


def test_an_sbatch_whose_answer_is_lost_is_found_in_slurm_not_called_refused(
    rs_home: Path, tmp_path: Path
) -> None:
    """sbatch that timed out waiting for slurmctld's reply (`Socket timed out on send/recv`) may
    have queued the job: `up` asks SLURM once (never submits again) and goes on with it; where
    SLURM has nothing, the record is FAILED and the error says what to look for."""
    shim = tmp_path / "shim"
    shim.mkdir()
    lost = "echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2"
    (shim / "sbatch").write_text(f'#!/bin/bash\n{shutil.which("sbatch")} "$@" >/dev/null\n{lost}\nexit 1\n')
    (shim / "sbatch").chmod(0o755)
    path = {"PATH": f"{shim}:{os.environ['PATH']}"}
    done = raystack("up", "-N", "1", "-P", "testbed", "--name", "lost", "--no-wait", env=path)
    assert done.returncode == 0, done.stderr
    assert "sbatch did not answer (" in done.stderr and "but SLURM queued the allocation" in done.stderr
    record = clusters.read("lost")
    assert record.allocation_id and record.state is ClusterState.SUBMITTED, record
    squeue = ["squeue", "-h", "-n", "raystack-lost", "-o", "%i"]
    assert subprocess.run(squeue, capture_output=True, text=True).stdout.split() == [record.allocation_id]
    assert raystack("down", "lost").returncode == 0
    (shim / "sbatch").write_text(f"#!/bin/bash\n{lost}\nexit 1\n")  # (it never reached slurmctld)
    done = raystack("up", "-N", "1", "-P", "testbed", "--name", "never", "--no-wait", env=path)
    assert done.returncode == 1 and "SLURM did not answer sbatch (" in done.stderr, done.stderr
    assert "it may have queued the allocation all the same: `squeue --name raystack-never`" in done.stderr
    assert "refused" not in done.stderr and clusters.read("never").state is ClusterState.FAILED


def test_a_name_is_submitted_once_and_an_up_stopped_in_sbatch_frees_it(rs_home: Path, tmp_path: Path) -> None:
    """Two `up --name x` at once submit one allocation (the first claims the name before sbatch);
    an `up` stopped while sbatch hangs (Ctrl-C) leaves a cluster that every command sees ended,
    and the next `up` of the name submits as usual."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sbatch").write_text("#!/bin/bash\nsleep 60\n")  # (slurmctld too busy to answer)
    (shim / "sbatch").chmod(0o755)
    argv = [
        sys.executable,
        "-m",
        "raystack.cli",
        "up",
        "-N",
        "1",
        "-P",
        "testbed",
        "--name",
        "held",
        "--no-wait",
    ]
    hung = subprocess.Popen(  # (Ctrl-C as in a terminal: a CI shell may start the tests with SIGINT ignored)
        argv,
        env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"},
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_until(lambda: clusters.exists("held") and clusters.read("held").submitter, 60, "the claim")
        second = raystack("up", "-N", "1", "-P", "testbed", "--name", "held", "--no-wait")
        assert second.returncode == 1, second.stderr
        assert "name 'held' is being submitted by another `raystack up`" in second.stderr
        squeue = ["squeue", "-h", "-n", "raystack-held", "-o", "%i"]
        assert subprocess.run(squeue, capture_output=True, text=True).stdout.split() == []
    finally:
        hung.send_signal(signal.SIGINT)
        hung.wait(timeout=30)
    assert clusters.read("held").state is ClusterState.SUBMITTED  # (as it was left: readers write nothing)
    status = raystack("status", "held", "--json")
    assert json.loads(status.stdout)["state"] == "FAILED", status.stdout
    refused = raystack("submit", "--cluster", "held", "--", "true")
    assert refused.returncode == 1 and "stopped before the allocation's id was recorded" in refused.stderr
    again = raystack("up", "-N", "1", "-P", "testbed", "--name", "held", "--no-wait")
    assert again.returncode == 0, again.stderr
    assert subprocess.run(squeue, capture_output=True, text=True).stdout.split() == [
        clusters.read("held").allocation_id
    ]
    assert raystack("down", "held").returncode == 0
    # `raystack down` while sbatch hangs, and then sbatch answers: the allocation it made is
    # cancelled, not written over the stopped cluster (nor over one begun anew meanwhile).
    go = tmp_path / "go"
    (shim / "sbatch").write_text(
        f'#!/bin/bash\nwhile [ ! -e {go} ]; do sleep 0.1; done\nexec {shutil.which("sbatch")} "$@"\n'
    )
    late = subprocess.Popen(
        argv, env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}, text=True, stderr=subprocess.PIPE
    )
    wait_until(lambda: clusters.read("held").state is ClusterState.SUBMITTED, 60, "the new claim")
    assert raystack("down", "held").returncode == 0
    go.touch()
    _, err = late.communicate(timeout=60)
    assert late.returncode == 1 and "cluster held was stopped or begun anew meanwhile: " in err, err
    assert clusters.read("held").state is ClusterState.STOPPED and not clusters.read("held").allocation_id
    wait_until(
        lambda: not subprocess.run(squeue, capture_output=True, text=True).stdout.split(), 30, "scancel"
    )


def test_a_constraint_no_node_has_is_refused_naming_the_features_there(rs_home: Path) -> None:
    """SLURM says only `Invalid feature specification`: sinfo's features are added."""
    feature = ["scontrol", "update", "NodeName=node1"]
    subprocess.run([*feature, "AvailableFeatures=h100", "ActiveFeatures=h100"], check=True)
    try:
        done = raystack("up", "-N", "1", "-P", "testbed", "-C", "H100", "--name", "typo")
        assert done.returncode == 1 and "Invalid feature specification" in done.stderr, done.stderr
        assert (
            "; --constraint H100: no node of partition testbed has feature 'H100' (their features, "
            "sinfo -o '%N %f': h100); did you mean h100? (names are case-sensitive)" in done.stderr
        )
        assert raystack("up", "-N", "1", "-P", "testbed", "-C", "h100", "--dry-run").returncode == 0
    finally:
        subprocess.run([*feature, "AvailableFeatures=", "ActiveFeatures="], check=True)


def test_a_walltime_over_the_partitions_limit_is_refused_before_sbatch(rs_home: Path) -> None:
    """Where SLURM does not enforce partition limits at submit, such a job waits (PENDING,
    PartitionTimeLimit) for ever: raystack reads the limit from sinfo and says so first."""
    limit = ["scontrol", "update", "PartitionName=testbed"]
    subprocess.run([*limit, "MaxTime=1-00:00:00"], check=True)
    try:
        done = raystack("up", "-N", "1", "-P", "testbed", "-t", "30:00:00", "--chain", "2", "--name", "long")
        assert done.returncode == 1 and not clusters.exists("long"), done.stderr
        assert (
            "--time 30:00:00: partition testbed allows at most 1-00:00:00 (sinfo); ask at most that, "
            "and add --chain N" in done.stderr
        )
        assert raystack("up", "-N", "1", "-P", "testbed", "-t", "1-0", "--dry-run").returncode == 0
    finally:
        subprocess.run([*limit, "MaxTime=INFINITE"], check=True)


def test_no_sbatch_on_path_is_one_line_naming_the_fix(rs_home: Path) -> None:
    done = raystack("up", "--nodes", "1", env={"PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 1
    assert "is not on PATH: no SLURM here" in done.stderr  # sinfo, asked first
    assert "`raystack up --local`" in done.stderr and done.stderr.count("\n") == 1
    assert clusters.list_names() == []  # nothing was created


def test_allocation_cancelled_while_waiting_names_the_logs(rs_home: Path) -> None:
    waiting = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raystack.cli",
            "up",
            "--nodes",
            "1",
            "--profile",
            "testbed",
            "--name",
            "later",
            "--sbatch=--begin=now+1hour",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert waiting.stderr is not None
    seen = []
    while not any("BeginTime" in line for line in seen):  # the CLI shows SLURM's reason
        line = waiting.stderr.readline()
        assert line, "raystack up ended before showing the PENDING reason: " + "".join(seen)
        seen.append(line)
    job = clusters.read("later").allocation_id
    slurm.scancel(str(job))
    _, rest = waiting.communicate(timeout=60)
    err = "".join(seen) + rest
    assert waiting.returncode == 1
    # (then, once SLURM has one, its start estimate: ", SLURM expects it to start at ...")
    assert f"PENDING in SLURM (job {job}, reason: BeginTime)" in err
    assert "cluster later FAILED" in err and "CANCELLED" in err
    assert str(paths.cluster("later").logs) in err


def test_a_cluster_behind_another_users_job_shows_when_slurm_expects_it(rs_home: Path) -> None:
    """Another user's job holds every node for 3 minutes: `status` says why the cluster waits
    and, once SLURM's scheduler has estimated it, when it expects to start (its end)."""
    other = subprocess.run(
        [
            *("sbatch", "--parsable", "--uid=65534", "--gid=65534", "--chdir=/tmp", "--output=/dev/null"),
            *(f"--nodes={NODES}", "--exclusive", "--time=3", "--job-name=another", "--wrap", "sleep 600"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        wait_until(lambda: (i := slurm.job_info(other)) and i.state.value == "RUNNING", 30, "the other job")
        up = raystack("up", "--nodes", "1", "--profile", "testbed", "--name", "behind", "--no-wait")
        assert up.returncode == 0, up.stderr
        wait_until(
            lambda: "SLURM expects it to start at" in raystack("status", "behind").stdout,
            90,
            "SLURM's start estimate in status",
        )
        said = raystack("status", "behind").stdout
        assert re.search(
            r"PENDING \((Resources|Priority)\), SLURM expects it to start at \d\d:\d\d, in ", said
        ), said
        st = json.loads(raystack("status", "behind", "--json").stdout)
        assert st["allocation_state"] == "PENDING", st
        assert st["allocation_reason"] in ("Resources", "Priority"), st
        ends = slurm.job_info(other).end_time  # type: ignore[union-attr]
        assert abs(st["allocation_expected_start"] - ends) <= 120, (st, ends)
    finally:
        slurm.scancel(other)
    assert raystack("down", "behind").returncode == 0


def test_waiting_for_a_pending_allocation_backs_off(rs_home: Path, tmp_path: Path) -> None:
    calls = slurm_shims(tmp_path / "shims")
    env = {"PATH": f"{tmp_path / 'shims'}:{os.environ['PATH']}"}
    up = raystack(
        "up",
        "--nodes",
        "1",
        "--profile",
        "testbed",
        "--name",
        "later",
        "--sbatch=--begin=now+1hour",
        "--no-wait",
    )
    assert up.returncode == 0, up.stderr
    job = clusters.read("later").allocation_id
    calls.write_text("")
    t0 = time.monotonic()
    done = raystack("wait", "later", "--timeout", "20s", env=env)
    waited = time.monotonic() - t0
    assert done.returncode == 1 and "not READY after 20s" in done.stderr
    squeues = [c for c in calls.read_text().splitlines() if c.startswith("squeue")]
    assert all(f"--jobs={job}" in c for c in squeues)
    assert 3 <= len(squeues) <= 2 + waited / 3, squeues  # 2 s at first, then backing off to 10 s


def test_node_that_never_joins_fails_the_start_naming_node_and_log(
    rs_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node2's Python hangs (as on a node with a stuck filesystem); the head gives up in time."""
    wrapper = rs_home / "python-wrapper"
    wrapper.write_text(
        f'#!/bin/bash\n[ "$(hostname)" = node2 ] && exec sleep 600\nexec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    profiles = tmp_path / "cfg" / "raystack" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "stuck.yaml").write_text(
        "partition: testbed\ngpus_per_node: 1\ncpus_per_task: 1\nobject_store_memory: 128MB\n"
        f"join_timeout: 10s\nsetup: ['RAYSTACK_PYTHON={wrapper}']\n"
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    done = raystack("up", "--nodes", "2", "--profile", "stuck", "--name", "stuck")
    assert done.returncode == 1
    message = clusters.read("stuck").message
    assert "node node2 did not join within 10s" in message
    assert str(paths.cluster("stuck").logs / "node-node2.log") in message
    assert "node node2 did not join" in done.stderr
    job = clusters.read("stuck").allocation_id
    # The failed cluster releases its allocation instead of holding the nodes until walltime.
    wait_until(lambda: (i := slurm.job_info(str(job))) and i.state.is_terminal(), 60, "release")
    wait_until(lambda: processes_of_job(str(job)) == [], 30, "every process to end")


def test_two_allocations_of_one_name_never_both_run_it(rs_home: Path) -> None:
    """A hand-submitted twin (or a second `up` whose record was lost) must not run a second
    queue runner on the same queue: `up` refuses, and a twin that starts anyway leaves."""
    env = {
        **os.environ,
        "RAYSTACK_CLUSTER": "dup",
        "RAYSTACK_PYTHON": sys.executable,
        "RAYSTACK_OBJECT_STORE_MEMORY": "128MB",
    }
    argv = [
        "sbatch",
        "--parsable",
        "--nodes=1",
        "--job-name=raystack-dup",
        f"--output={rs_home / 'dup-%j.out'}",  # not slurm-%j.out in the working directory
        str(REPO / "slurm" / "raystack.sbatch"),
    ]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()
    wait_until(lambda: clusters.exists("dup"), 120, "the hand-submitted allocation to create its record")
    Cluster("dup").wait_ready(timeout=180)
    assert clusters.read("dup").allocation_id == first
    # The record is lost (made to look ended): SLURM still runs the allocation, and `up` asks it.
    clusters.update("dup", state=ClusterState.STOPPED)
    done = raystack("up", "--nodes", "1", "--profile", "testbed", "--name", "dup")
    assert done.returncode == 1, done.stdout
    assert f"SLURM job {first} (RUNNING) already runs a cluster named 'dup'" in done.stderr
    clusters.update("dup", state=ClusterState.READY)
    # A twin submitted by hand starts, sees the first alive, and leaves without touching it.
    second = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()
    wait_until(lambda: (i := slurm.job_info(second)) and i.state.is_terminal(), 120, "the twin to leave")
    twin_node = slurm.job_info(second).nodes  # type: ignore[union-attr]
    log = (paths.cluster("dup").node_log(twin_node)).read_text()
    assert f"cluster dup is already run by SLURM job {first} (RUNNING); allocation {second} leaves" in log
    record = clusters.read("dup")
    assert record.allocation_id == first and record.state is ClusterState.READY
    assert Cluster("dup").status().ready
    Cluster("dup").down()
