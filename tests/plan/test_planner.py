"""The planner against the seeds' own arithmetic (shared/seeds 000, 001, 002), infeasible layouts,
and properties over random cluster shapes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raystack.plan.batch import keep_effective_batch
from raystack.plan.memory import engine_memory, learner_memory, model
from raystack.plan.topology import Infeasible, Shape, place, plan_grpo

ISAMBARD = Shape(nodes=10, gpus_per_node=4, cpus_per_node=288)  # GH200: 4 x 72 cores


def test_seed_000_seven_b_on_ten_isambard_nodes() -> None:
    """Beaker's 5 x 8 GPUs moved to 10 x 4: 20 learners, 20 engines of TP 1."""
    layout = plan_grpo(ISAMBARD, learners=20, tp=1)
    assert layout.open_instruct() == [
        "--num_learners_per_node",
        *["2"] * 10,
        "--vllm_num_engines",
        "20",
        "--vllm_tensor_parallel_size",
        "1",
    ]
    assert all(placed == (2, 2) for placed in layout.placement)  # 2 learner GPUs + 2 engines per node
    assert layout.verl() == [
        "trainer.nnodes=10",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]
    assert layout.openrlhf()[:4] == ["--actor.num_nodes", "10", "--actor.num_gpus_per_node", "2"]


def test_single_gpu_mode() -> None:
    layout = plan_grpo(Shape(1, 1, 16), learners=1)
    assert layout.single_gpu and layout.open_instruct()[-1] == "--single_gpu_mode"


def test_open_instruct_1431_bundle_larger_than_a_node_is_refused_with_the_nearest_fit() -> None:
    """{GPU: 6, CPU: 60} on 32-CPU nodes waits forever at 'Waiting for placement group'."""
    shape = Shape(nodes=4, gpus_per_node=8, cpus_per_node=32)
    with pytest.raises(
        Infeasible, match=r"bundle of 6 GPUs asks 60 CPUs \(10 per GPU\) but nodes have 32"
    ) as info:
        plan_grpo(shape, learners=12, engines=4, per_bundle=6)
    nearest = info.value.nearest
    assert nearest is not None
    place(shape, list(nearest.learner_bundles), nearest.engines, nearest.tp)  # it really fits
    assert max(nearest.learner_bundles) * 10 <= 32


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"learners": 8, "per_bundle": 8}, r"bundle of 8 GPUs does not fit a node of 4 GPUs"),
        ({"learners": 44, "per_bundle": 4}, r"11 learner bundles need 11 nodes"),
        (
            {"learners": 20, "engines": 30},
            r"30 engines of TP 1 do not fit the GPUs the learners leave: 20 fit",
        ),
        ({"learners": 20, "tp": 8}, r"an engine with TP 8 needs 8 GPUs on one node, but nodes have 4"),
    ],
)
def test_infeasible_layouts_say_why(kwargs: dict, reason: str) -> None:
    with pytest.raises(Infeasible, match=reason):
        plan_grpo(ISAMBARD, **kwargs)


def test_seed_001_memory_tables() -> None:
    """Seed 001 counts Adam's m and v only (8 bytes per parameter): reproduced with
    optimizer_bytes=8. DeepSpeed's bf16 mixed precision also keeps fp32 master weights, so the
    default (12) is 4 bytes per parameter higher; activations are an estimate on both sides."""
    for name, learners, params, optimizer in (("7b", 2, 7, 28), ("32b", 8, 8, 32), ("32b", 16, 4, 16)):
        seed = learner_memory(model(name), learners, optimizer_bytes=8)
        assert seed.parameters == pytest.approx(params, rel=0.05) and seed.gradients == pytest.approx(
            params, rel=0.05
        )
        assert seed.optimizer == pytest.approx(optimizer, rel=0.05)
        ours = learner_memory(model(name), learners)
        assert ours.optimizer == pytest.approx(optimizer * 1.5, rel=0.05)
    seven = learner_memory(model("7b"), 2, seq_len=16384, optimizer_bytes=8)
    assert 57 <= seven.total <= 67  # the seed's 57-67 GB / 95 GB
    tight = learner_memory(model("32b"), 8, seq_len=8192)
    assert tight.warning is None and tight.fraction > 0.75  # "tight fit"
    assert learner_memory(model("32b"), 4, seq_len=8192).warning  # would not fit: said so


def test_seed_001_vllm_tp() -> None:
    """'32B won't fit on 1 GPU' at gpu_memory_utilization 0.55; TP 2 does."""
    assert not engine_memory(model("32b"), tp=1, gpu_memory_utilization=0.55).fits
    two = engine_memory(model("32b"), tp=2, gpu_memory_utilization=0.55)
    assert two.fits and two.max_tokens > 100_000


@pytest.mark.parametrize(
    ("old", "new", "accum", "effective", "difference"),
    [((1, 8, 64), 4, 16, 512, 0.0), ((1, 8, 64), 6, 11, 528, 0.03125), ((1, 6, 64), 6, 11, 396, 0.03125)],
)
def test_seed_002_effective_batch(
    old: tuple, new: int, accum: int, effective: int, difference: float
) -> None:
    plan = keep_effective_batch(*old, new)
    assert (plan.grad_accum, plan.effective) == (accum, effective)
    assert plan.difference == pytest.approx(difference)


shapes = st.builds(
    Shape,
    nodes=st.integers(1, 24),
    gpus_per_node=st.sampled_from([1, 2, 4, 8]),
    cpus_per_node=st.sampled_from([8, 16, 32, 64, 128, 288]),
)


@settings(max_examples=300, deadline=2000)
@given(
    shape=shapes,
    learners=st.integers(1, 64),
    engines=st.one_of(st.none(), st.integers(0, 64)),
    tp=st.sampled_from([1, 2, 4, 8]),
    cpus=st.sampled_from([1, 4, 10]),
)
def test_planned_layouts_never_overcommit_a_node(
    shape: Shape, learners: int, engines: int | None, tp: int, cpus: int
) -> None:
    try:
        layout = plan_grpo(shape, learners, engines, tp, cpus_per_learner_gpu=cpus)
    except Infeasible as exc:
        assert exc.reason
        if exc.nearest is not None:
            check(exc.nearest, cpus)
        return
    check(layout, cpus)
    if not layout.single_gpu:
        assert layout.learners == learners


def check(layout, cpus: int) -> None:  # type: ignore[no-untyped-def]
    s = layout.shape
    assert len(layout.placement) == (s.nodes if not layout.single_gpu else 1)
    assert sum(1 for lg, _ in layout.placement if lg) == len(layout.learner_bundles)  # one bundle per node
    for learner_gpus, engines in layout.placement:
        assert learner_gpus + engines * layout.tp <= s.gpus_per_node or layout.single_gpu
        assert learner_gpus * cpus + engines * layout.tp <= s.cpus_per_node or layout.single_gpu
    assert sum(e for _, e in layout.placement) == layout.engines


def test_one_node_and_one_engine_are_said_in_the_singular() -> None:
    with pytest.raises(Infeasible, match=r"after 3 learners \(1 node x 4 GPUs x 72 CPUs\)"):
        plan_grpo(Shape(1, 4, 72), learners=3, tp=2)
    assert plan_grpo(Shape(1, 4, 72), learners=2, tp=2).summary() == "2 learners (2), 1 engine x TP 2"
