"""The planner's flags against the frameworks' own definitions, read from their released
packages (installed with --no-deps into .venv/frameworks by `make install`: no GPU wheels, no
import of them): OpenRLHF's argparse flags (openrlhf/cli/train_ppo_ray.py, read with ast) and
verl's packaged trainer config (verl/trainer/config/_generated_ppo_trainer.yaml). open-instruct
is not released on the package registry (it runs from a clone), so its flags cannot be checked
here; the test says so in its skip reason."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import yaml

from raystack.plan.topology import Shape, plan_grpo

FRAMEWORKS = Path(
    os.environ.get("RAYSTACK_FRAMEWORKS", Path(__file__).resolve().parents[2] / ".venv" / "frameworks")
)
LAYOUT = plan_grpo(Shape(4, 4, 64), learners=8, tp=2)


def found(relative: str) -> Path:
    path = FRAMEWORKS / relative
    if not path.is_file():
        pytest.skip(f"{relative} not installed in {FRAMEWORKS} (make install puts it there)")
    return path


def argparse_flags(path: Path) -> set[str]:
    """Every option string given to an add_argument call in a module (without importing it)."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.startswith("--")
                ):
                    flags.add(arg.value)
    return flags


def test_openrlhf_takes_every_flag_the_planner_gives_it() -> None:
    flags = argparse_flags(found("openrlhf/cli/train_ppo_ray.py"))
    assert len(flags) > 50  # (the real parser, not an empty file)
    given = [f for f in LAYOUT.openrlhf() if f.startswith("--")]
    assert given and not [f for f in given if f not in flags], given


def test_verl_has_every_key_the_planner_sets() -> None:
    config = yaml.safe_load(found("verl/trainer/config/_generated_ppo_trainer.yaml").read_text())
    for item in LAYOUT.verl():
        key, _, value = item.partition("=")
        node = config
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"verl has no {key}"
            node = node[part]
        assert isinstance(node, int) and value.isdigit(), (key, node)


def test_open_instruct_cannot_be_checked_here() -> None:
    pytest.skip(
        "open-instruct is not released on the package registry (it runs from a clone): its "
        "--num_learners_per_node, --vllm_num_engines, --vllm_tensor_parallel_size and "
        "--single_gpu_mode are those of open_instruct/grpo_fast.py, not checked automatically"
    )


def test_trl_takes_every_flag_the_trl_job_and_its_batch_plan_give_it() -> None:
    """jobs/grpo_tiny/trl_grpo.yaml passes its command's flags to TRL's own GRPOConfig (parsed
    by HfArgumentParser as TRL's scripts do): every one of them, and the two the batch plan fills
    in, is a field of the released GRPOConfig."""
    trl = pytest.importorskip("trl", reason="trl is in the test-train extra (make install)")
    import dataclasses

    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "jobs/grpo_tiny/trl_grpo.yaml").read_text())
    given = [w.split("=")[0].removeprefix("--") for w in spec["command"].split() if w.startswith("--")]
    assert {"per_device_train_batch_size", "gradient_accumulation_steps"} <= set(given), given
    assert given and not [f for f in given if f not in fields], given
    assert len(fields) > 100  # (the real config, not an empty class)


def test_the_verl_job_sets_only_keys_of_the_released_verl_config() -> None:
    """jobs/grpo_tiny/verl_grpo.yaml hands verl's main_ppo Hydra overrides: each key is one of the
    released trainer config's (a `+key` adds to a mapping that must exist), so verl's struct
    config takes every one of them."""
    config = yaml.safe_load(found("verl/trainer/config/_generated_ppo_trainer.yaml").read_text())
    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "jobs/grpo_tiny/verl_grpo.yaml").read_text())
    overrides = spec["entrypoint"].split("verl.trainer.main_ppo", 1)[1].split()
    keys = [o.split("=", 1)[0] for o in overrides if "=" in o]
    assert "{plan.flags}" in overrides and len(keys) > 20
    for key in keys:
        adds = key.startswith("+")
        parts = key.removeprefix("+").split(".")
        node = config
        for part in parts[:-1] if adds else parts:
            assert isinstance(node, dict) and part in node, f"verl has no {key}"
            node = node[part]
        assert not adds or isinstance(node, dict), f"{key}: verl's {'.'.join(parts[:-1])} is no mapping"
