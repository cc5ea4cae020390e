"""A spec that asks for a plan: filled in from the cluster at submit and again at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec.load import load_spec
from raystack.spec.planning import PlanSpec, substitute
from raystack.spec.resolve import resolve
from raystack.spec.submission import submit_options
from raystack.store.cluster import ClusterRecord, ClusterState

ISAMBARD = ClusterRecord(
    name="isa", state=ClusterState.READY, nodes_expected=10, gpus_per_node=4, cpus_per_node=288
)


def spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grpo.yaml"
    path.write_text(text)
    return path


def test_flags_are_filled_from_the_cluster(tmp_path: Path) -> None:
    path = spec(
        tmp_path,
        "name: g\nentrypoint: python grpo_fast.py {plan.flags} --seed ${SEED:-1}\n"
        "plan: {learners: 20, tp: 1}\n",
    )
    request = resolve(load_spec(path), ISAMBARD, tmp_path, "job spec g")
    assert request.entrypoint.startswith("python grpo_fast.py {plan.flags}")  # filled when it starts
    entry = submit_options(request, ISAMBARD)["entrypoint"]
    assert "python grpo_fast.py --num_learners_per_node 2 2 2 2 2 2 2 2 2 2 --vllm_num_engines 20" in entry
    assert entry.endswith("--vllm_tensor_parallel_size 1 --seed ${SEED:-1}")  # the shell's own braces stay
    # When it starts, the plan is made again for the allocation it got: 5 nodes cannot hold it.
    smaller = ISAMBARD.model_copy(update={"nodes_expected": 5})
    nearest = r"no GPU is left .* nearest that fits: 10 learners \(2 2 2 2 2\), 10 engines"
    with pytest.raises(ConfigError, match=nearest):
        submit_options(request, smaller)


def test_named_values_and_other_frameworks() -> None:
    plan = PlanSpec(learners=8, engines=8, framework="verl")
    line = substitute("train {plan.flags} n={plan.learners} e={plan.engines}", plan, ISAMBARD, "x")
    assert (
        line.startswith("train trainer.nnodes=") and "n=40 e=40" in line
    )  # verl: every GPU learns and rolls out
    line = substitute("x {plan.flags}", PlanSpec(learners=8, engines=8, framework="openrlhf"), ISAMBARD, "x")
    assert "--actor.num_nodes" in line and "--vllm.num_engines 8" in line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "plan: {learners: 44, per_bundle: 4}\n",
            r"field 'plan': 11 learner bundles need 11 nodes .* nearest that fits",
        ),
        ("plan: {learners: 2, tp: 8}\n", r"an engine with TP 8 needs 8 GPUs on one node"),
        ("plan: {learners: 2, learner: 1}\n", r"unknown key 'plan.learner' \(did you mean 'learners'\?\)"),
        ("plan: {learners: 2, kind: ppo}\n", r"field 'plan.kind'"),
    ],
)
def test_infeasible_or_wrong_plans_are_refused_at_submit(tmp_path: Path, text: str, message: str) -> None:
    path = spec(tmp_path, "name: g\nentrypoint: python t.py {plan.flags}\n" + text)
    with pytest.raises(ConfigError, match=message):
        resolve(load_spec(path), ISAMBARD, tmp_path, "job spec g")


def test_placeholders_need_a_plan_and_must_exist(tmp_path: Path) -> None:
    # (refused with the spec, before any cluster is asked: `raystack check` says it anywhere)
    with pytest.raises(ConfigError, match=r"grpo.yaml: entrypoint uses \{plan.\*\} but the spec has no"):
        load_spec(spec(tmp_path, "name: g\nentrypoint: t {plan.flags}\n"))
    spmd = "name: g\nkind: spmd\nlauncher: torchrun\ncommand: t.py --ga {plan.grad_accum}\n"
    with pytest.raises(ConfigError, match=r"command uses \{plan.\*\} but the spec has no 'plan:'"):
        load_spec(spec(tmp_path, spmd))
    bad = spec(tmp_path, "name: g\nentrypoint: t {plan.learner}\nplan: {learners: 2}\n")
    with pytest.raises(ConfigError, match=r"\{plan.learner\} is not a grpo plan value"):
        resolve(load_spec(bad), ISAMBARD, tmp_path, "s")


def test_a_plan_can_be_set_from_the_command_line(tmp_path: Path) -> None:
    path = spec(tmp_path, "name: g\nentrypoint: t {plan.flags}\nplan: {learners: 2}\n")
    loaded = load_spec(path, ["plan.learners=20", "plan.tp=2"])
    assert loaded.plan is not None and (loaded.plan.learners, loaded.plan.tp) == (20, 2)


def test_describe_says_what_a_plan_comes_to_on_the_cluster() -> None:
    from raystack.spec.planning import PlanSpec, describe

    batch = PlanSpec(kind="batch", old="1x8x64", micro=8)
    assert describe(batch, ClusterRecord(name="c", nodes_expected=1, gpus_per_node=8), "t", 6) == (
        "effective batch 6 x 8 x 11 = 528 (was 1x8x64: +3.1%)"
    )
    grpo = PlanSpec(kind="grpo", learners=20, tp=1)
    line = describe(grpo, ClusterRecord(name="c", nodes_expected=10, gpus_per_node=4, cpus_per_node=288), "t")
    assert line == "20 learners (2 2 2 2 2 2 2 2 2 2), 20 engines x TP 1 (open-instruct)"


def test_gpu_nodes_grown_beside_a_head_without_gpus_are_what_jobs_count(tmp_path: Path) -> None:
    """The heterogeneous case (issue 44): a head on a CPU partition, 2 GPU nodes of 4 GPUs grown
    from another; jobs' needs, SPMD defaults and plans count the GPU nodes (drivers run on the head)."""
    from raystack.spec.resolve import spmd_processes
    from raystack.store.cluster import Grown

    head = ClusterRecord(
        name="het", state=ClusterState.READY, nodes_expected=1, gpus_per_node=0, cpus_per_node=8
    )
    with pytest.raises(ConfigError, match=r"needs.gpus=8 but .* has 1 node x 0 GPUs"):
        resolve(load_spec(spec(tmp_path, "name: g\nentrypoint: x\nneeds: {gpus: 8}\n")), head, tmp_path, "g")
    grown = head.model_copy(
        update={"grown": [Grown(alloc_id="9", nodes=2, gpus_per_node=4, cpus_per_node=32)]}
    )
    assert grown.held == (2, 4, 32) and grown.nodes_held == 2
    resolve(load_spec(spec(tmp_path, "name: g\nentrypoint: x\nneeds: {gpus: 8}\n")), grown, tmp_path, "g")
    path = spec(tmp_path, "name: g\nentrypoint: python grpo.py {plan.flags}\nplan: {learners: 4, tp: 1}\n")
    entry = submit_options(resolve(load_spec(path), grown, tmp_path, "g"), grown)["entrypoint"]
    assert "--num_learners_per_node 2 2 --vllm_num_engines 4" in entry, entry
    torchrun = load_spec(spec(tmp_path, "name: t\nkind: spmd\nlauncher: torchrun\ncommand: train.py\n"))
    assert spmd_processes(torchrun, grown) == 8
    # Once it leaves, nothing is counted but the head again.
    left = grown.model_copy(update={"grown": [grown.grown[0].model_copy(update={"leaving": "shrink"})]})
    assert left.held == (1, 0, 8)
