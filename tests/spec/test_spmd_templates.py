"""The SPMD templates (jobs/spmd) load as kind: spmd jobs and render against the seeds' clusters:
the launcher and its arguments, and the effective batch kept on the GPUs the job really gets."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec.load import load_spec
from raystack.spec.planning import substitute
from raystack.spec.resolve import check_needs, spmd_processes
from raystack.store.cluster import ClusterRecord

TEMPLATES = Path(__file__).resolve().parents[2] / "jobs" / "spmd"


def cluster(nodes: int, gpus: int, cpus: int = 64) -> ClusterRecord:
    return ClusterRecord(
        name=f"c{nodes}x{gpus}", nodes_expected=nodes, gpus_per_node=gpus, cpus_per_node=cpus
    )


# template: (cluster it is written for, launcher, driver arguments, what the command must hold)
EXPECTED = {
    "supercloud_ddp_2gpu": (
        cluster(1, 2, 40),
        "torchrun",
        ["--nodes=1", "--procs-per-node=2"],
        ["grpo_code_execute_distributed.py", "--training_args.per_device_train_batch_size=4"],
    ),
    "brtx_rlcr_4gpu": (
        cluster(1, 4),
        "accelerate",
        ["--nodes=1", "--procs-per-node=4", "--launcher-arg=--config_file=deepspeed.yaml"],
        ["--per_device_train_batch_size 8", "--gradient_accumulation_steps 16"],  # 4 x 8 x 16 = 512
    ),
    "brtx_rlcr_6gpu": (
        cluster(1, 8),
        "accelerate",
        ["--nodes=1", "--procs-per-node=6", "--launcher-arg=--config_file=deepspeed_6gpu.yaml"],
        ["--per_device_train_batch_size 8", "--gradient_accumulation_steps 11"],  # 528, +3.1%
    ),
    "neox_isambard": (
        cluster(16, 4, 288),
        "deepspeed",
        ["--procs-per-node=4"],  # every node of the cluster: 16 here, 64 for pretraining
        ["neox_train.py configs/my_model.yml configs/isambard_setup.yml"],
    ),
}


def test_every_template_is_checked() -> None:
    assert {p.stem for p in TEMPLATES.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_renders_for_its_cluster(name: str) -> None:
    target, launcher, driver_args, command_parts = EXPECTED[name]
    spec = load_spec(TEMPLATES / f"{name}.yaml")
    assert spec.kind == "spmd" and spec.launcher == launcher and spec.working_dir
    check_needs(spec, target, name)
    line = substitute(spec.entrypoint, spec.plan, target, name, spmd_processes(spec, target))
    driver, _, command = line.partition(" -- ")
    words = shlex.split(driver)
    assert words[:4] == ["python", "-m", "raystack.launch.spmd", f"--launcher={launcher}"]
    for arg in driver_args:
        assert arg in words, (arg, words)
    for part in command_parts:
        assert part in command, (part, command)
    assert "{plan." not in line
    assert "CUDA_VISIBLE_DEVICES" not in spec.env  # the GPUs Ray assigns, never a fixed mask


def test_the_six_process_template_says_how_far_the_batch_moved() -> None:
    spec = load_spec(TEMPLATES / "brtx_rlcr_6gpu.yaml")
    from raystack.spec.planning import batch_values

    assert spec.plan is not None
    values = batch_values(spec.plan, 6, "t")
    assert values["effective"] == "528" and values["difference"] == "+3.1%"


def test_a_template_asking_more_than_the_cluster_has_is_refused_before_queueing() -> None:
    spec = load_spec(TEMPLATES / "brtx_rlcr_6gpu.yaml")
    with pytest.raises(ConfigError, match="procs_per_node=6"):
        check_needs(spec, cluster(1, 4), "brtx_rlcr_6gpu")


def test_neox_replaces_the_hostfile_on_any_number_of_nodes() -> None:
    spec = load_spec(TEMPLATES / "neox_isambard.yaml")
    for nodes in (4, 64):
        target = cluster(nodes, 4, 288)
        assert spmd_processes(spec, target) == nodes * 4
        assert "--nodes=" not in spec.entrypoint  # no fixed node count: the cluster's
