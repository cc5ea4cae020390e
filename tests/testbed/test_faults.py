"""Hangs and deaths as distributed jobs really meet them, on a 2-node testbed cluster (CPU, gloo;
the same on GPUs with NCCL: tests/gpu/suite.py's `faults` part).

Hang = no progress, whatever the meters say (allocation/watchdog/progress.py): the whole CPU corpus of
tests/hangs runs as jobs (healthy programs quiet for 3 x hang_timeout SUCCEED, never suspected;
hung ones FAIL within hang_timeout + 60 s saying where they wait), and a torchrun job whose rank 1
never joins while rank 0 spins on a CPU core inside one call (as NCCL spins in
cudaStreamSynchronize) ends FAILED `hung: ...` naming both ranks. A rank killed by SIGKILL or
SIGSEGV ends the job FAILED within 30 s, the rank and the signal in the message. The job queued
behind each fault runs."""

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

from ..conftest import module_home, wait_until
from ..hangs.cases import HERE as CORPUS
from ..hangs.cases import Case, cases
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


def test_a_rank_spinning_where_its_peer_never_joins_ends_the_job_hung_with_the_rank_named(fl: dict) -> None:
    """Rank 0 polls its all-reduce on a CPU core inside one call (as NCCL spins in
    cudaStreamSynchronize) while rank 1 never joins (the sleeping form is the corpus's
    peer_never_joins, below)."""
    mode = "spin"
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
    # (spinning inside one call on a CPU core: where, and rank 1 asleep in its sleep)
    assert re.search(r"rank 0 running in main \(rankfault\.py:\d+\)", record.message), record.message
    assert re.search(r"rank 1 asleep in main \(rankfault\.py:\d+\)", record.message)
    dumps = job.stacks()
    assert dumps.kept and {p.name.split("-")[0] for p in dumps.files} >= {"node1", "node2"}
    assert after.wait(timeout=300).state is JobState.SUCCEEDED
    assert launched(fl["cluster"].record().allocation_id or "") == []


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


CORPUS_HANG = 20  # s: the corpus jobs' hang_timeout; the healthy ones work 3 x that, printing nothing
BATCHES = [  # (side by side on the cluster, as many as 2 cores give time to move; busy ones spread)
    ["torch_item", "torch_item_toplevel", "hf_trainer", "peer_never_joins", "sleep_forever", "lock_deadlock"],
    ["torch_nosync", "deepspeed_zero", "matmul_chain", "ray_get_forever", "poll_retry", "spin_in_call"],
    ["pandas_prep", "mp_pool", "checkpoint_write", "ray_driver", "dataloader_stuck"],
]


# An SPMD job that first waits for its nodes (a job beside it holds a CPU its whole-node bundles
# need; their placement group is the launch host's, made at the submit): waiting is not a hang (GPU
# suite, 1 x H100: two such jobs were stopped as hung while other jobs held the GPU); its point is
# the wait, so it works hang_timeout seconds once its ranks run
WAITS, HOLD = Case("torch_nosync", True, ranks=2), 2 * CORPUS_HANG


def corpus_job(cluster: Cluster, case: Case, name: str = "", seconds: int = 3 * CORPUS_HANG) -> Job:
    sets = [
        f"name={name or case.name}",
        f"hang_timeout={CORPUS_HANG}s",
        f"env.CORPUS_SECONDS={seconds}",
        "env.CORPUS_DEVICE=cpu",
    ]
    if case.ranks > 1:  # (one rank on each node)
        spmd = [f"command={case.script}", f"nodes={case.ranks}", "procs_per_node=1"]
        return cluster.submit(CORPUS / "spmd.yaml", sets=sets + spmd, now=True)
    return cluster.submit(["python", case.script], sets=[*sets, f"working_dir={CORPUS}"], now=True)


def hold_a_cpu(cluster: Cluster) -> Job:
    """A job whose driver holds one CPU for HOLD seconds, running when this returns."""
    sets = ["name=holds_a_cpu", "entrypoint_num_cpus=1"]
    holder = cluster.submit(["sleep", str(HOLD)], sets=sets, now=True)
    wait_until(lambda: holder.state is JobState.RUNNING, 60, "the CPU holder running")
    return holder


def started_at(job: Job) -> float:
    """When its last rank printed its start line (`CORPUS start ... t=...`); the job's start else."""
    found = [float(t) for t in re.findall(r"CORPUS start \S+ rank=\d+ t=([\d.]+)", job.logs())]
    return max(found) if found else job.record().started or 0.0


def test_the_hang_corpus_healthy_programs_run_hung_ones_fail_naming_where(fl: dict) -> None:
    """Every CPU program of tests/hangs, as a job with hang_timeout 20s: each healthy one prints
    nothing for 60 s and SUCCEEDS, never suspected of a hang; each hung one FAILS `hung: ...`
    within hang_timeout + 60 s of its start line, its message saying where it waits."""
    cluster, by_name = fl["cluster"], {c.name: c for c in cases(gpu=False)}
    assert sorted(n for batch in BATCHES for n in batch) == sorted(by_name)  # (the whole CPU corpus)
    suspected: dict[str, str] = {}
    for batch in BATCHES:
        jobs = {name: corpus_job(cluster, by_name[name]) for name in batch}
        if batch is BATCHES[-1]:
            holder = hold_a_cpu(cluster)
            by_name["waits_for_nodes"] = WAITS
            jobs["waits_for_nodes"] = corpus_job(cluster, WAITS, "waits", CORPUS_HANG)
        deadline = time.time() + 600
        while time.time() < deadline:
            records = {name: job.record() for name, job in jobs.items()}
            for name, record in records.items():
                if record.message.startswith("suspected") and by_name[name].healthy:
                    suspected[name] = record.message
            if all(r.state.is_terminal() for r in records.values()):
                break
            time.sleep(1.0)
        for name, job in jobs.items():
            case, record = by_name[name], job.record()
            if case.healthy:
                assert record.state is JobState.SUCCEEDED, (name, record.message, job.logs()[-3000:])
                assert job.logs().count("CORPUS done") == case.ranks, (name, job.logs()[-2000:])
                continue
            assert record.state is JobState.FAILED, (name, record.message)
            assert record.message.startswith(f"hung: no progress for {CORPUS_HANG}s "), (name, record.message)
            assert re.search(case.where, record.message), (name, record.message)
            took = (record.ended or time.time()) - started_at(job)
            assert took <= CORPUS_HANG + 60, (name, took, record.message)
            assert job.stacks().kept and job.stacks().files, name  # (the dumps taken before the stop)
    waited, freed = jobs["waits_for_nodes"], holder.record()  # (its ranks began once the CPU was free)
    assert freed.state is JobState.SUCCEEDED and started_at(waited) >= (freed.ended or 0) - 1, waited.logs()
    assert suspected == {}, suspected
    assert launched(cluster.record().allocation_id or "") == []  # (no rank left behind)
