"""SPMD jobs through the queue on the testbed (CPU, gloo): torchrun, the DeepSpeed launcher and
accelerate across nodes, a rank that fails, a stop — and nothing left behind on any node."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.client import Job
from raystack.launch.pool import LEASE
from raystack.store import cluster as clusters
from raystack.store.ledger import JobState

from ..conftest import NODES, module_home, processes_of_job, wait_until

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]
DEBUG = REPO / "jobs" / "debug"
LAUNCHED = ("torchrun", "deepspeed", "accelerate", "spmd.py", "ds_zero3.py", "accel_ds.py")


@pytest.fixture(scope="module")
def sp(testbed: Path) -> Iterator[dict]:
    if NODES < 4:
        pytest.skip("needs 4 testbed nodes")
    with module_home(testbed, "spmd") as home:
        # (2 GPUs a node: a job of 2 processes per node takes whole nodes, on the launch hosts)
        cluster = Cluster.up(4, profile="testbed", name="sp", timeout=300, gpus_per_node=2)
        yield {"cluster": cluster, "home": home, "job": clusters.read("sp").allocation_id}
        cluster.down()


def lines(job: Job, prefix: str) -> list[dict]:
    found = []
    for line in job.logs().splitlines():
        text = line.split("] ", 1)[1] if line.startswith("[node ") else line
        if text.startswith(prefix + " "):
            found.append(json.loads(text.removeprefix(prefix + " ")))
    return found


def launched(alloc: str) -> list[str]:
    """Processes of the launchers or their ranks still alive anywhere in the allocation."""
    return [cmd for _, cmd in processes_of_job(alloc) if any(word in cmd for word in LAUNCHED)]


def test_torchrun_across_four_nodes(sp: dict) -> None:
    job = sp["cluster"].submit(
        DEBUG / "spmd.yaml", sets=["procs_per_node=2", "command=spmd.py --steps 3 --chatter 200"]
    )
    record = job.wait(timeout=600)
    assert record.state is JobState.SUCCEEDED, job.logs()[-3000:]
    # cde9410: `... ok=TrueSPMD rank=1 ...`: two ranks of a node glued their lines in one pipe.
    chatter = [ln for ln in job.logs().splitlines() if "SPMD_CHATTER" in ln]
    assert len(chatter) == 8 * 200
    for ln in chatter:
        prefix, text = ln.split("] ", 1)
        rank = int(prefix.rsplit(" ", 1)[1])
        assert text.startswith(f"SPMD_CHATTER rank={rank} ") and text.endswith("x" * 64), ln
    ranks = lines(job, "SPMD_RANK")
    assert sorted(r["rank"] for r in ranks) == list(range(8)) and {r["world"] for r in ranks} == {8}
    assert all(r["allreduce_ok"] for r in ranks)
    assert {r["nice"] for r in ranks} == {0}  # not Ray's worker niceness (15)
    assert {r["omp_num_threads"] for r in ranks} == {"1"}  # torchrun's, as under srun (not Ray's 4)
    by_node: dict[int, set] = {}
    for r in ranks:
        by_node.setdefault(r["node_rank"], set()).add(r["host"])
    assert sorted(by_node) == [0, 1, 2, 3] and all(len(h) == 1 for h in by_node.values())
    assert len({h for hs in by_node.values() for h in hs}) == 4  # four different nodes
    assert all(len(r["cuda_visible_devices"].split(",")) == 2 for r in ranks)  # the GPUs Ray gave the node
    assert "on the cluster's launch hosts" in job.logs()  # (launch/pool.py: no new actor per node)
    assert lines(job, "SPMD_DEBUG")[0]["ddp_in_sync"]
    assert "[node 3] " in job.logs()  # every line carries its node's rank


def test_deepspeed_launcher_no_ssh_zero3_matches_reference(sp: dict) -> None:
    job = sp["cluster"].submit(
        ["ds_zero3.py", "--steps", "4"],
        sets=[
            "name=ds",
            "launcher=deepspeed",
            "nodes=2",
            "procs_per_node=2",
            f"working_dir={DEBUG}",
            "env.DS_ACCELERATOR=cpu",
        ],
    )
    record = job.wait(timeout=600)
    assert record.state is JobState.SUCCEEDED, job.logs()[-3000:]
    [result] = lines(job, "DS_ZERO3")
    assert result["world"] == 4 and result["matches_reference"] and result["max_rel_error"] <= 1e-3
    assert "raystack spmd: deepspeed on 2 nodes x 2 processes" in job.logs()
    assert (
        "--no_ssh --node_rank=1 --num_nodes=2 --num_gpus=2" in job.logs()
    )  # no ssh: each node starts itself
    # DeepSpeed's hostfile of each node goes with the job (one per run was left in /tmp)
    hostfiles = set(re.findall(r"--hostfile[= ](\S+)", job.logs()))
    assert len(hostfiles) == 2, job.logs()[-3000:]
    wait_until(lambda: not any(os.path.exists(h) for h in hostfiles), 30, "the hostfiles to go")


def test_accelerate_with_a_deepspeed_config_across_two_nodes(sp: dict) -> None:
    extra = [
        "--use_deepspeed",
        "--deepspeed_config_file=ds_config.json",
        "--deepspeed_multinode_launcher=standard",
    ]
    job = sp["cluster"].submit(
        ["accel_ds.py"],
        sets=[
            "name=accel",
            "launcher=accelerate",
            "nodes=2",
            "procs_per_node=2",
            f"working_dir={DEBUG}",
            "env.DS_ACCELERATOR=cpu",
            f"launcher_args={json.dumps(extra)}",
        ],
    )
    record = job.wait(timeout=600)
    assert record.state is JobState.SUCCEEDED, job.logs()[-3000:]
    ranks = lines(job, "ACCEL_RANK")
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3] and len({r["host"] for r in ranks}) == 2
    assert all(r["world"] == 4 for r in ranks), ranks  # one world, not four processes alone
    assert "DEEPSPEED" in ranks[0]["type"]


def test_a_failing_rank_fails_the_job_fast_and_leaves_nothing(sp: dict) -> None:
    cluster: Cluster = sp["cluster"]
    job = cluster.submit(
        DEBUG / "spmd.yaml",
        sets=["name=fails", "procs_per_node=2", "command=spmd.py --fail-rank 3 --fail-code 3 --sleep 120"],
    )
    after = cluster.submit(["python", "-c", "print('after the failure')"], sets=["name=after-fail"])
    record = job.wait(timeout=300)
    assert record.state is JobState.FAILED
    assert "node 1 rank 3 exited 3" in record.message, record.message
    assert record.exit_code == 3
    ran = record.ended - record.started  # type: ignore[operator]
    assert ran < 60, ran  # not the 120 s the other ranks would have slept
    wait_until(lambda: launched(sp["job"]) == [], 30, "every rank and launcher to end")
    assert after.wait(timeout=300).state is JobState.SUCCEEDED


def test_stop_leaves_no_process_on_any_node(sp: dict) -> None:
    cluster: Cluster = sp["cluster"]
    job = cluster.submit(
        DEBUG / "spmd.yaml", sets=["name=long", "procs_per_node=2", "command=spmd.py --sleep 600"]
    )
    wait_until(lambda: len(lines(job, "SPMD_RANK")) == 8, 300, "every rank to start")
    t0 = time.time()
    record = job.stop()
    assert record.state is JobState.STOPPED
    wait_until(lambda: launched(sp["job"]) == [], 30, "every rank and launcher to end")
    assert time.time() - t0 < record.request.stop_grace + 30
    assert "raystack spmd: stopped" in job.logs()


def test_a_killed_driver_leaves_no_rank_on_the_launch_hosts(sp: dict) -> None:
    """The ranks of a job on the launch hosts (launch/pool.py) outlive no driver: SIGKILL, which
    no handler sees, stops them within the hosts' lease, as a launcher actor's death would."""
    cluster: Cluster = sp["cluster"]
    job = cluster.submit(
        DEBUG / "spmd.yaml", sets=["name=orphan", "procs_per_node=2", "command=spmd.py --sleep 600"]
    )
    wait_until(lambda: len(lines(job, "SPMD_RANK")) == 8, 300, "every rank to start")
    assert "on the cluster's launch hosts" in job.logs()
    drivers = [pid for pid, cmd in processes_of_job(sp["job"]) if "raystack.launch.spmd" in cmd]
    assert drivers  # (its python, and the shell Ray's job supervisor started it with)
    for pid in drivers:
        os.kill(pid, signal.SIGKILL)
    assert job.wait(timeout=120).state is not JobState.SUCCEEDED
    wait_until(lambda: launched(sp["job"]) == [], LEASE + 30, "every rank and launcher to end")


def test_launched_at_the_submit_and_nothing_left_where_no_driver_took_it(sp: dict) -> None:
    """The queue runner asks the head's launch host to start a job's launchers as it submits it
    (launch/ahead.py); its driver adopts them. A job stopped as soon as it was submitted (its
    driver may never run) leaves no rank and no placement group: the next job takes every node."""
    cluster: Cluster = sp["cluster"]
    early = cluster.submit(
        DEBUG / "spmd.yaml", sets=["name=early", "procs_per_node=2", "command=spmd.py --sleep 600"]
    )
    wait_until(lambda: early.state is not JobState.QUEUED, 120, "the job to be submitted", interval=0.02)
    early.stop()
    wait_until(lambda: launched(sp["job"]) == [], LEASE + 30, "every rank and launcher to end")
    job = cluster.submit(DEBUG / "spmd.yaml", sets=["name=next", "procs_per_node=2", "command=spmd.py"])
    record = job.wait(timeout=300)  # (a placement group left would hold every node's CPUs)
    assert record.state is JobState.SUCCEEDED, job.logs()[-3000:]
    assert "started at the submit" in job.logs(), job.logs()[-3000:]
    assert len(lines(job, "SPMD_RANK")) == 8

    def watchers() -> list[str]:  # (launch/process.py: after_exit, one per launch while it runs)
        return [cmd for _, cmd in processes_of_job(sp["job"]) if "rs-ranks-" in cmd]

    wait_until(lambda: watchers() == [], 10, "no launch's watcher to outlive its launch")


def test_a_job_without_a_working_dir_runs_where_it_was_submitted(
    sp: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As sbatch does (Ray alone would run it wherever `ray start` ran: the folder of `up`): the
    driver and every rank start in the folder `submit` ran in; a folder gone by the time the
    job starts is said in its log, and the job runs all the same."""
    here = tmp_path / "project"
    here.mkdir()
    (here / "where.py").write_text("import os\nprint('WHERE', os.environ.get('RANK', 'driver'), os.getcwd())")
    spec = "name: ranks\nkind: spmd\nlauncher: torchrun\ncommand: where.py\nnodes: 2\nprocs_per_node: 2\n"
    (here / "ranks.yaml").write_text(spec)
    monkeypatch.chdir(here)
    driver = sp["cluster"].submit(["python", "where.py"])
    ranks = sp["cluster"].submit("ranks.yaml")
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    late = sp["cluster"].submit(["python", "-c", "import os; print('WHERE late', os.getcwd())"])
    monkeypatch.chdir(tmp_path)
    gone.rmdir()  # (before it starts: the two jobs above run first)
    for job in (driver, ranks, late):
        assert job.wait(timeout=300).state is JobState.SUCCEEDED, job.logs()[-3000:]
    assert f"WHERE driver {here}" in driver.logs()
    seen = [ln.split("WHERE ", 1)[1] for ln in ranks.logs().splitlines() if "WHERE " in ln]
    assert sorted(seen) == [f"{r} {here}" for r in range(4)], ranks.logs()[-3000:]
    assert "on the cluster's launch hosts" in ranks.logs()
    log = late.logs()
    warned = [ln for ln in log.splitlines() if str(gone) in ln and "Running entrypoint" not in ln]
    assert warned and "raystack: warning: the job runs in " in log and "WHERE late " in log, log[-2000:]


def test_trl_grpo_trainer_unchanged_twice_in_one_allocation_with_the_plans_batch(sp: dict) -> None:
    """TRL's own GRPOTrainer (seed 002's stack: accelerate + DeepSpeed ZeRO-2) over 2 nodes x 1
    process, twice in one allocation: it learns, logs its reward and loss, and the effective batch
    TRL used is the one the batch plan kept (1 x 16 x 4 = 64 written for one process -> 2 x 16 x 2)."""
    spec = REPO / "jobs" / "grpo_tiny" / "trl_grpo.yaml"
    sets = ["nodes=2", "procs_per_node=1", "env.DS_ACCELERATOR=cpu"]
    runs = [
        sp["cluster"].submit(spec, sets=[*sets, f"outputs.run={sp['home'] / f'trl-{i}'}"]) for i in range(2)
    ]
    for job in runs:
        record = job.wait(timeout=900)
        assert record.state is JobState.SUCCEEDED, job.logs()[-4000:]
        [trl] = lines(job, "TRL_GRPO")
        assert trl["processes"] == 2 and trl["deepspeed"] and trl["zero_stage"] == 2
        assert "new launcher actors (1 of a node's 2 GPUs)" in job.logs()  # (not the launch hosts)
        assert (trl["per_device_train_batch_size"], trl["gradient_accumulation_steps"]) == (16, 2)
        assert trl["effective_batch"] == 64 and trl["steps"] == 30 and len(trl["rewards"]) == 30
        assert max(trl["rewards"][15:]) > trl["rewards"][0] and len(trl["losses"]) == 30
    # (one allocation; side by side, as their nodes are a declared demand that packs: 2 + 2 of 4)
    assert {a.allocation for job in runs for a in job.record().attempts} == {
        sp["cluster"].record().allocation_id
    }
    assert launched(sp["job"]) == []
