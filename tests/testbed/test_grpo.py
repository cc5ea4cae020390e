"""GRPO on the persistent cluster: grpo_tiny through the queue with real vLLM engines (CPU) and
DeepSpeed ZeRO-3 learners, the layout from the planner; a stopped run resumes from its checkpoint;
a debug job follows in the same allocation.

The cluster: 4 testbed nodes with one (fake) GPU each, so the planner's layout puts the two
learners on two nodes and the two engines on the two others.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.client import Job
from raystack.store.ledger import JobState

from ..conftest import NODES, module_home, wait_until

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "jobs" / "grpo_tiny" / "grpo_tiny.yaml"


@pytest.fixture(scope="module")
def gc(testbed: Path) -> Iterator[dict]:
    if NODES < 4:
        pytest.skip("needs 4 testbed nodes (learners and engines on different nodes)")
    with module_home(testbed, "grpo") as home:
        cluster = Cluster.up(4, profile="testbed", name="gc", gpus_per_node=1, timeout=300)
        yield {"cluster": cluster, "home": home}
        cluster.down()


def steps(job: Job) -> list[dict]:
    return [
        json.loads(ln.removeprefix("GRPO_STEP "))
        for ln in job.logs().splitlines()
        if ln.startswith("GRPO_STEP ")
    ]


def summary(job: Job) -> dict:
    line = next(ln for ln in job.logs().splitlines() if ln.startswith("GRPO "))
    return json.loads(line.removeprefix("GRPO "))


def test_grpo_tiny_learns_across_a_stop_and_its_resume_and_a_debug_job_follows(gc: dict) -> None:
    """One 25-step run, stopped after 8 steps or more (it saves a checkpoint on SIGTERM) and
    submitted again: the second run starts at the saved step and ends at 25, and the 25 steps'
    rewards together show it learns. (One run with a stop in it, not a whole run and a stopped one:
    a vLLM-on-CPU run is minutes of CI.)"""
    cluster: Cluster = gc["cluster"]
    out = gc["home"] / "grpo-a"
    sets = [f"outputs.checkpoints={out}"]
    first = cluster.submit(SPEC, sets=sets)
    wait_until(
        lambda: len(steps(first)) >= 8 or first.state.is_terminal(), 900, "eight steps of the first run"
    )
    stopped = first.stop()
    assert stopped.state is JobState.STOPPED, first.logs()[-3000:]
    assert "checkpoint saved" in first.logs()
    s1 = summary(first)
    saved = s1["end_step"]
    assert 8 <= saved < 25 and s1["stopped"] and len(s1["rewards"]) == saved, s1
    again = cluster.submit(SPEC, sets=sets)
    hello = cluster.submit(REPO / "jobs" / "debug" / "hello.yaml")
    record = again.wait(timeout=1200)
    assert record.state is JobState.SUCCEEDED, again.logs()[-4000:]
    log = again.logs()
    assert f"starting at step {saved} (resumed: True)" in log
    # The planner's layout, filled into the entrypoint when each run started.
    layout = "grpo_tiny.py --num_learners_per_node 1 1 --vllm_num_engines 2 --vllm_tensor_parallel_size 1"
    assert layout in first.logs() and layout in log
    s = summary(again)
    assert s["start_step"] == saved and s["end_step"] == 25 and len(s["rewards"]) == 25 - saved, s
    assert s["rollouts"] == "vllm" and s["engines"] == 2 and s["learners"] == 2
    assert len(s["learner_hosts"]) == 2 and len(s["engine_hosts"]) == 2
    assert not set(s["learner_hosts"]) & set(s["engine_hosts"])  # four different nodes
    rewards = s1["rewards"] + s["rewards"]
    first5, last5 = statistics.mean(rewards[:5]), statistics.mean(rewards[-5:])
    assert last5 - first5 >= 0.3, rewards  # it learns the task (random: ~0.07)
    for one in (s1, s):
        assert one["weights_synced_every_step"] and one["weights_changed_every_step"], one
    assert all(r["checksum_engines"] == [r["checksum_learner"]] * 2 for r in steps(first) + steps(again))
    assert (out / "ckpt" / "latest").exists()
    after = hello.wait(timeout=300)
    assert after.state is JobState.SUCCEEDED and record.ended <= after.started  # type: ignore[operator]
    print(
        "GRPO_TINY "
        + json.dumps({"rewards": rewards, "engine_start_s": s["engine_start_s"], "median_s": s["median_s"]})
    )


def test_a_vllm_engine_that_dies_mid_step_fails_the_run_at_once_naming_it(gc: dict) -> None:
    """Engine 0's process is SIGKILLed 0.05 s into its generate of step 2 (a GPU fault, the OOM
    killer): the run ends FAILED within 30 s, the message names the engine actor and its death,
    and the job queued behind it runs. (One learner and one engine: half the start of the
    planner's two and two, which the test above runs.)"""
    cluster: Cluster = gc["cluster"]
    sets = [
        f"outputs.checkpoints={gc['home'] / 'grpo-c'}",
        "plan.learners=1",
        "plan.engines=1",
        "entrypoint=python grpo_tiny.py {plan.flags} --steps 4 --kill-engine-at-step 2",
    ]
    job, hello = cluster.submit(SPEC, sets=sets), cluster.submit(REPO / "jobs" / "debug" / "hello.yaml")
    record = job.wait(timeout=1200)
    assert record.state is JobState.FAILED, job.logs()[-3000:]
    died = re.search(r"GRPO_FAULT engine pid (\d+) dies in ([\d.]+)s t=([\d.]+)", job.logs())
    assert died, job.logs()[-3000:]
    assert (record.ended or 0) - float(died[3]) - float(died[2]) <= 30, record
    assert re.search(rf"Engine pid {died[1]}\b", record.message), record.message
    assert re.search(r"SIGKILL|died|ActorDiedError", record.message), record.message
    assert hello.wait(timeout=300).state is JobState.SUCCEEDED


def test_on_one_gpu_the_learner_and_the_engine_share_it(testbed: Path) -> None:
    """The planner gives a one-GPU cluster --single_gpu_mode: one learner and one engine in one
    bundle on that GPU (fractional GPUs, as open-instruct colocates them), the weights pushed over
    gloo (NCCL cannot join two processes on one device), and the run still learns."""
    with module_home(testbed, "grpo1") as home:
        cluster = Cluster.up(1, profile="testbed", name="g1", gpus_per_node=1, timeout=300)
        try:
            job = cluster.submit(
                SPEC,
                sets=[
                    f"outputs.checkpoints={home / 'one'}",
                    "plan.learners=1",
                    "plan.engines=1",
                    "name=grpo-one-gpu",
                    "entrypoint=python grpo_tiny.py {plan.flags} --steps 6 --learner-cpus-per-gpu 1",
                ],
            )
            record = job.wait(timeout=1200)
            assert record.state is JobState.SUCCEEDED, job.logs()[-4000:]
            assert "--single_gpu_mode" in job.logs()
            s = summary(job)
            assert s["single_gpu_mode"] and s["sync_backend"] == "gloo"
            # one and the same GPU; which index SLURM hands out depends on what else holds the node
            assert len(s["learner_gpus"]) == 1 and s["engine_gpus"] == s["learner_gpus"], s
            assert s["weights_synced_every_step"] and s["weights_changed_every_step"]
        finally:
            cluster.down()
