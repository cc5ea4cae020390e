"""Hangs and deaths as distributed jobs really meet them, on a 2-node testbed cluster (CPU, gloo;
the same on GPUs with NCCL: tests/gpu/suite.py's `faults` part).

Hang = no progress, whatever the meters say (allocation/progress.py): a torchrun job whose rank 1
never joins the second all-reduce ends FAILED `hung: ...` naming the rank that never arrived,
whether rank 0 sleeps in gloo's wait or spins on a CPU core inside one call (as NCCL spins in
cudaStreamSynchronize); a quiet evaluation whose stack changes, and a GRPO-shaped job whose
learner sleeps while its generator works, print nothing for longer than their hang_timeout and
SUCCEED. A rank killed by SIGKILL or SIGSEGV ends the job FAILED within 30 s, the rank and the
signal in the message. The job queued behind each fault runs."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.client import Job
from raystack.store import paths
from raystack.store.ledger import JobState

from ..conftest import module_home
from .test_cluster import raystack
from .test_spmd import launched

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
DEBUG = Path(__file__).resolve().parents[2] / "jobs" / "debug"
HANG = 15  # s: the faulty jobs' hang_timeout
PROFILE = """\
description: testbed, usage sampled every 2 s
partition: testbed
gpus_per_node: 4
cpus_per_task: 4
object_store_memory: 256MB
join_timeout: 120s
env:
  RAYSTACK_TESTBED: "1"
  RAYSTACK_SAMPLE_EVERY: "2"
"""


@pytest.fixture(scope="module")
def fl(testbed: Path) -> Iterator[dict]:
    with module_home(testbed, "faults") as home:
        profile = home / "faults.yaml"
        profile.write_text(PROFILE)
        cluster = Cluster.up(2, profile=str(profile), name="fl", timeout=300)
        yield {"cluster": cluster}
        cluster.down()


def test_the_interconnect_canary_says_why_it_skipped_the_testbed(fl: dict) -> None:
    """The testbed's GPUs are stand-ins: no NCCL to test; `status` says so (the canary itself runs
    on the GPU machine: tests/gpu/suite.py)."""
    record = fl["cluster"].record()
    assert record.canary == {"state": "skipped", "why": "no NVIDIA driver on the head (nvidia-smi not found)"}
    shown = raystack("status", "fl")
    assert "interconnect canary skipped: no NVIDIA driver on the head" in shown.stdout, shown.stdout


def rankfault(cluster: Cluster, mode: str, *extra: str, hang: float = HANG) -> Job:
    return cluster.submit(
        DEBUG / "rankfault.yaml",
        sets=[
            f"name=rf-{mode}",
            f"command=rankfault.py --mode {mode} {' '.join(extra)}",
            "procs_per_node=1",
            f"hang_timeout={hang:g}s",
        ],
    )


def first_line_time(job: Job) -> float:
    """When the ranks were past their first all-reduce (their RANKFAULT first line, as logged)."""
    deadline = time.time() + 300
    while time.time() < deadline:
        if "RANKFAULT first" in job.logs():
            return time.time()
        if job.record().state.is_terminal():
            break
        time.sleep(0.5)
    raise AssertionError(f"no RANKFAULT first line: {job.logs()[-2000:]}")


@pytest.mark.parametrize("mode", ["hang", "spin"])
def test_a_rank_that_never_joins_ends_the_job_hung_with_the_rank_named(fl: dict, mode: str) -> None:
    cluster = fl["cluster"]
    job, after = rankfault(cluster, mode), cluster.submit(DEBUG / "hello.yaml")
    since = first_line_time(job)
    record = job.wait(timeout=HANG + 200)
    took = (record.ended or time.time()) - since
    assert record.state is JobState.FAILED, record.message
    assert record.message.startswith(f"hung: no progress for {HANG}s (no output, no stack moved): "), (
        record.message
    )
    assert took <= HANG + 60, (took, record.message)
    if mode == "hang":  # (asleep in gloo's wait: its stack is in all_reduce)
        assert re.search(r"rank 0 waits in all_reduce at rankfault\.py:\d+", record.message), record.message
        assert re.search(r"rank 1 never arrived \(asleep in main \(rankfault\.py:\d+\)\)", record.message)
    else:  # (spinning inside one call on a CPU core: where, and rank 1 asleep in its sleep)
        assert re.search(r"rank 0 running in main \(rankfault\.py:\d+\)", record.message), record.message
        assert re.search(r"rank 1 asleep in main \(rankfault\.py:\d+\)", record.message)
    dumps = job.stacks()
    assert dumps.kept and {p.name.split("-")[0] for p in dumps.files} >= {"node1", "node2"}
    assert after.wait(timeout=300).state is JobState.SUCCEEDED
    assert launched(fl["cluster"].record().allocation_id or "") == []


def test_what_moves_quietly_is_not_hung(fl: dict) -> None:
    """Side by side, one node each, printing nothing for twice their hang_timeout: an evaluation in
    a numpy loop whose stack changes (on a CPU all the time) and a GRPO-shaped job whose learner
    sleeps in ray.get while its generator works."""
    cluster = fl["cluster"]
    busy = cluster.submit(
        DEBUG / "rankfault.yaml",
        sets=[
            "name=rf-busy",
            f"command=rankfault.py --mode busy --seconds {2 * HANG}",
            "procs_per_node=1",
            "nodes=1",
            "needs.nodes=1",
            f"hang_timeout={HANG}s",
        ],
    )
    slow = cluster.submit(
        ["python", "slowgen.py", "--rounds", "1", "--seconds", str(2 * HANG)],
        sets=[f"working_dir={DEBUG}", "name=slowgen", f"hang_timeout={HANG}s", "needs.nodes=1"],
    )
    evaluation, learner = busy.wait(timeout=600), slow.wait(timeout=600)
    assert evaluation.state is JobState.SUCCEEDED, evaluation.message
    assert learner.state is JobState.SUCCEEDED, learner.message
    assert busy.logs().count("RANKFAULT done") == 1 and '"rounds": 1' in slow.logs()
    assert (evaluation.started or 0) < (learner.ended or 0) and (learner.started or 0) < (
        evaluation.ended or 0
    )


def fault_time(job: Job) -> float:
    """When the rank met its fault, as it said (`RANKFAULT fault kill t=...`)."""
    found = re.search(r"RANKFAULT fault \S+ t=([\d.]+)", job.logs())
    assert found, job.logs()[-3000:]
    return float(found[1])


@pytest.mark.parametrize(
    ("mode", "words"), [("kill", "-9 (killed by SIGKILL)"), ("segv", "-11 (killed by SIGSEGV)")]
)
def test_a_rank_that_dies_fails_the_job_within_30s_naming_it(fl: dict, mode: str, words: str) -> None:
    cluster = fl["cluster"]
    job, after = rankfault(cluster, mode), cluster.submit(DEBUG / "hello.yaml")
    record = job.wait(timeout=300)
    assert record.state is JobState.FAILED, record.message
    assert f"node 1 rank 1 exited {words}" in record.message, record.message
    took = (record.ended or 0) - fault_time(job)
    assert took <= 30, (took, record.message)
    assert after.wait(timeout=300).state is JobState.SUCCEEDED
    assert launched(cluster.record().allocation_id or "") == []


SECRET = "s3cr3t-Value 'with' $pace\"s"  # (what a shell would mangle unquoted)


def test_a_jobs_secrets_reach_its_driver_and_ranks_and_are_written_nowhere(fl: dict) -> None:
    """`submit --secret NAME`: the value, from the submitter's environment, reaches the driver and
    every SPMD rank on every node; afterwards nothing in the cluster folder (ledgers, logs, Ray's
    copied logs with their runtime_env), nor the `--json` output of submit, job and queue, holds it."""
    env = {"RAYSTACK_TEST_TOKEN": SECRET, "RAYSTACK_CLUSTER": "fl"}
    name = "RAYSTACK_TEST_TOKEN"
    driver = raystack(
        "submit", "--secret", name, "--working-dir", str(DEBUG), "--json",
        "--", "python", "envcheck.py", name, env=env,
    )  # fmt: skip
    ranks = raystack(
        "submit", str(DEBUG / "rankfault.yaml"), "--secret", name, "--set", "procs_per_node=1",
        "--set", f"command=envcheck.py {name}", "--set", "name=secret-ranks", "--json", env=env,
    )  # fmt: skip
    assert driver.returncode == 0 and ranks.returncode == 0, driver.stderr + ranks.stderr
    jobs = [Job("fl", json.loads(out.stdout)["id"]) for out in (driver, ranks)]  # (one job: one object)
    digest = hashlib.sha256(SECRET.encode()).hexdigest()[:16]
    for job, count in zip(jobs, (1, 2), strict=True):
        record = job.wait(timeout=300)
        assert record.state is JobState.SUCCEEDED, job.logs()[-2000:]
        assert record.request.secrets == [name]
        seen = [
            json.loads(ln.split("ENV_SEEN ", 1)[1]) for ln in job.logs().splitlines() if "ENV_SEEN " in ln
        ]
        assert [s["seen"] for s in seen] == [{name: digest}] * count, seen
    assert len({s["host"] for s in seen}) == 2  # (the ranks: one on each node)
    shown = (
        raystack("job", jobs[0].id, "--json", env=env).stdout
        + raystack("queue", "--all", "--json", env=env).stdout
    )
    root = paths.cluster("fl").root
    found = subprocess.run(["grep", "-rlF", SECRET, str(root)], capture_output=True, text=True)
    assert found.stdout == "" and SECRET not in shown + driver.stdout + ranks.stdout
    assert not list((root / "secrets").glob("*"))  # (each job's file went when it ended)
