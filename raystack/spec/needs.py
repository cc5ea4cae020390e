"""What a job declares it occupies (needs: nodes, GPUs, CPUs; what the queue packs and grows for),
and what changes when it resumes after an interruption (resume: set, env)."""

from __future__ import annotations

from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from raystack.spec.values import (
    SpecModel,
    validate_env,
)


class Needs(SpecModel):
    """What the job needs from the cluster; checked against the live cluster before queueing."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, value: Any) -> Any:
        """`needs: 4`: say what it takes. (A model validator, not the spec's field validator: the
        yes/no check walks into needs only where the spec has no validator of its own for it.)"""
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(
                f"{value:g} is not a mapping: needs takes gpus, nodes, gpus_per_node, cpus, e.g. "
                f"needs: {{gpus: {value:g}}}"
            )
        return value

    nodes: int | None = Field(default=None, ge=1)
    """Nodes the job needs. A job that declares needs (nodes, or gpus/cpus rounded up to whole
    nodes) occupies only those and runs beside others; one that declares none has the cluster."""
    gpus: int | None = Field(default=None, ge=0)
    """GPUs in all."""
    cpus: int | None = Field(default=None, ge=0)
    """CPUs in all."""
    gpus_per_node: int | None = Field(default=None, ge=0)
    """GPUs on each node it uses."""
    cpus_per_gpu: float | None = Field(default=None, ge=0)
    """CPUs for each GPU (refused when a node has fewer)."""


class Resume(SpecModel):
    """How an interrupted job is submitted again (besides RAYSTACK_RESUME=1 in its env)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    set: list[str] = Field(default_factory=list)
    """--set overrides for the resumed run, e.g. ["entrypoint=python t.py --resume"]."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment added for the resumed run."""

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> dict[str, str]:
        return validate_env(value, reserved=("RAYSTACK_",))
