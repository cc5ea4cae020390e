"""The GRPO templates (jobs/grpo) load, and their layouts render against the seeds' cluster shapes:
10 and 16 Isambard nodes of 4 GH200 GPUs (72 cores each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec.load import load_spec
from raystack.spec.planning import substitute
from raystack.store.cluster import ClusterRecord

TEMPLATES = Path(__file__).resolve().parents[2] / "jobs" / "grpo"


def isambard(nodes: int) -> ClusterRecord:
    return ClusterRecord(name=f"isambard{nodes}", nodes_expected=nodes, gpus_per_node=4, cpus_per_node=288)


OI_10 = "--num_learners_per_node 2 2 2 2 2 2 2 2 2 2 --vllm_num_engines 20 --vllm_tensor_parallel_size 1"
OI_16 = "--num_learners_per_node 2 2 2 2 2 2 2 2 2 2 --vllm_num_engines 44 --vllm_tensor_parallel_size 1"
OI_32B = (
    "--num_learners_per_node " + " ".join(["1"] * 16) + " --vllm_num_engines 16 --vllm_tensor_parallel_size 2"
)
VERL = "trainer.nnodes={} trainer.n_gpus_per_node=4 actor_rollout_ref.rollout.tensor_model_parallel_size=2"
ORLHF = "--actor.num_nodes 4 --actor.num_gpus_per_node 2 --vllm.num_engines 8 --vllm.tensor_parallel_size 1"
EXPECTED = {
    # template: {nodes: flags expected in the entrypoint, or the refusal}
    "open_instruct_7b_rlzero": {
        10: OI_10,
        16: OI_16,  # six more nodes: the learners stay, the engines take every GPU left
    },
    "open_instruct_32b_debug": {
        10: ConfigError("16 learner bundles need 16 nodes"),
        16: OI_32B,
    },
    "open_instruct_single_node_debug": {
        10: "--num_learners_per_node 2 --vllm_num_engines 2 --vllm_tensor_parallel_size 1",
        16: "--num_learners_per_node 2 --vllm_num_engines 2 --vllm_tensor_parallel_size 1",
    },
    "verl_grpo_qwen2_7b": {
        10: VERL.format(10),
        16: VERL.format(16),
    },
    "openrlhf_grpo": {
        10: ORLHF,
        16: ORLHF,
    },
}


def test_every_template_is_checked() -> None:
    assert {p.stem for p in TEMPLATES.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("nodes", [10, 16])
def test_template_layout(name: str, nodes: int) -> None:
    spec = load_spec(TEMPLATES / f"{name}.yaml")
    assert spec.plan is not None and spec.working_dir and spec.outputs
    expected = EXPECTED[name][nodes]
    if isinstance(expected, ConfigError):
        with pytest.raises(ConfigError, match=str(expected)):
            substitute(spec.entrypoint, spec.plan, isambard(nodes), name)
        return
    line = substitute(spec.entrypoint, spec.plan, isambard(nodes), name)
    assert expected in line, line
    assert "{plan." not in line
    if "open_instruct" in name:  # the seeds' settings travel with the template
        assert (
            '--checkpoint_state_dir "$RAYSTACK_OUTPUT_CHECKPOINTS"' in line
            and "--vllm_sync_backend gloo" in line
        )
