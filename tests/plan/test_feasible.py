"""Which pending demands can never be placed (the watchdog stops such jobs): pure arithmetic."""

from __future__ import annotations

from raystack.plan.feasible import Demand, why_infeasible

NODE = {"CPU": 16.0, "GPU": 4.0, "memory": 64e9, "object_store_memory": 8e9, "node:10.0.0.1": 1.0}
FOUR = [NODE, {**NODE, "node:10.0.0.2": 1.0}, {**NODE, "CPU": 8.0}, {**NODE, "GPU": 0.0}]


def test_an_actor_wanting_more_gpus_than_any_node_has_is_named() -> None:
    why = why_infeasible(Demand("actor", "Big", [{"CPU": 1.0, "GPU": 5.0}]), FOUR)
    assert why == "actor Big wants {GPU: 5, CPU: 1}; the largest node has {GPU: 4, CPU: 16}"
    assert why_infeasible(Demand("actor", "Fits", [{"CPU": 16.0, "GPU": 4.0}]), FOUR) is None


def test_a_custom_resource_no_node_has_and_a_task_too_big() -> None:
    why = why_infeasible(Demand("task", "prep", [{"CPU": 1.0, "TPU": 4.0}]), FOUR)
    assert why is not None and why.startswith("task prep wants {CPU: 1, TPU: 4}") and "TPU: 0" in why
    assert "CPU: 16" in str(why_infeasible(Demand("task", "t", [{"CPU": 100.0}]), [NODE]))
    assert "the node has" in str(why_infeasible(Demand("task", "t", [{"CPU": 100.0}]), [NODE]))


def test_placement_groups_by_bundle_total_and_strategy() -> None:
    learners = [{"GPU": 4.0, "CPU": 40.0}]  # open-instruct's 10 CPUs per learner GPU: fits no 16-CPU node
    assert "wants {GPU: 4, CPU: 40}" in str(why_infeasible(Demand("placement group", "pg", learners), FOUR))
    spread = [{"GPU": 2.0}] * 5
    assert "STRICT_SPREAD" in str(
        why_infeasible(Demand("placement group", "pg", spread, "STRICT_SPREAD"), FOUR)
    )
    assert why_infeasible(Demand("placement group", "pg", spread[:3], "STRICT_SPREAD"), FOUR) is None
    packed = [{"GPU": 2.0}] * 3
    assert "STRICT_PACK" in str(why_infeasible(Demand("placement group", "pg", packed, "STRICT_PACK"), FOUR))
    assert why_infeasible(Demand("placement group", "pg", packed, "PACK"), FOUR) is None
    too_many = [{"GPU": 4.0}] * 4
    assert "in all" in str(why_infeasible(Demand("placement group", "pg", too_many, "PACK"), FOUR))
    ray_said = Demand("placement group", "pg", [{"CPU": 1.0}], "", ray_says_infeasible=True)
    assert "Ray: INFEASIBLE" in str(why_infeasible(ray_said, FOUR))


def test_bundles_inside_a_group_and_node_affinity_keys_are_not_demands() -> None:
    inside = Demand("actor", "A", [{"CPU_group_0_abc": 1.0, "GPU_group_abc": 1.0, "node:10.0.0.9": 0.001}])
    assert why_infeasible(inside, FOUR) is None
    assert why_infeasible(Demand("actor", "A", [{"GPU": 99.0}]), []) is None  # no node alive: cannot judge
