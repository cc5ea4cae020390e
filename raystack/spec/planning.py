"""A job spec that asks for a plan: the layout is computed from the cluster and put into the
entrypoint, at submit (so an infeasible plan is refused before anything is queued) and again
when the job starts (the allocation may differ from the one it was queued for).

    plan: {kind: grpo, learners: 20, tp: 1}
    entrypoint: python open_instruct/grpo_fast.py {plan.flags} --model_name_or_path ...

Placeholders: {plan.flags} (the framework's flags), {plan.num_learners_per_node},
{plan.vllm_num_engines}, {plan.vllm_tensor_parallel_size}, {plan.single_gpu_mode}, {plan.learners},
{plan.engines}, {plan.nodes}, {plan.gpus_per_node}. Nothing else in the entrypoint is touched
(shell `${VAR}` stays as it is).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from pydantic import ConfigDict, Field

from raystack.adapters.allocator import allocator
from raystack.errors import ConfigError
from raystack.plan.batch import keep_effective_batch
from raystack.plan.topology import (
    LEARNER_CPUS_PER_GPU,
    GrpoLayout,
    Infeasible,
    Shape,
    nodes_wanted,
    plan_colocated,
    plan_grpo,
)
from raystack.spec.values import SpecModel
from raystack.store.cluster import ClusterRecord
from raystack.store.ledger import JobRequest

PLACEHOLDER = re.compile(r"\{plan\.([a-z_]+)\}")


class PlanSpec(SpecModel):
    """What a job asks the planner for: a GRPO layout, or the batch arithmetic of a new GPU count."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: Literal["grpo", "batch"] = "grpo"
    """`grpo`: learners and vLLM engines on the nodes; `batch`: keep an effective batch on a new GPU count."""
    old: str | None = Field(default=None, pattern=r"^\d+x\d+x\d+$")
    """batch: the old run as processes x micro-batch x accumulation, e.g. 1x8x64."""
    processes: int | None = Field(default=None, ge=1)
    """batch: processes of the new run (default: an SPMD job's nodes x processes per node)."""
    micro: int | None = Field(default=None, ge=1)
    """batch: micro-batch of the new run (default: the old one's)."""
    framework: Literal["open-instruct", "verl", "openrlhf"] = "open-instruct"
    """grpo: whose flags {plan.args} holds."""
    learners: int = Field(default=1, ge=1, le=100_000)
    """grpo: learner GPUs (the DeepSpeed world size; verl: every GPU learns and rolls out)."""
    engines: int | None = Field(default=None, ge=0, le=100_000)
    """grpo: vLLM engines (default: as many as fit the GPUs left)."""
    tp: int = Field(default=1, ge=1, le=64)
    """grpo: tensor parallel size of each engine."""
    per_bundle: int | None = Field(default=None, ge=1, le=64)
    """grpo: learner GPUs per placement bundle (default: spread over the nodes)."""
    cpus_per_learner_gpu: int = Field(default=LEARNER_CPUS_PER_GPU, ge=0, le=1024)
    """grpo: CPUs each learner GPU's bundle asks for (open-instruct: 10)."""


def occupied(cluster: ClusterRecord, needs: dict[str, Any] | None) -> ClusterRecord:
    """The part of the cluster a job plans on: the whole, or the nodes its `needs` occupies (a
    job side by side with others plans its layout on its own nodes; one that needs more than the
    cluster holds, within its max_nodes, plans on the nodes the queue grows it to)."""
    if not needs:
        return cluster
    held = cluster.held
    nodes = nodes_wanted(needs, held)
    one_machine = not allocator(cluster.backend).remote  # (it never grows)
    grows = not one_machine and nodes is not None and held[0] < nodes <= (cluster.max_nodes or 0)
    if nodes is None or (nodes >= held[0] and not grows):
        return cluster
    # (fewer nodes than held: its own; more, on a cluster the queue grows: the nodes it will hold)
    shape = {"gpus_per_node": held[1], "cpus_per_node": held[2]}
    return cluster.model_copy(update={"nodes_expected": nodes, "grown": [], **shape})


def grown_for(plan: PlanSpec, cluster: ClusterRecord) -> int | None:
    """The fewest nodes, up to the cluster's max_nodes, on which a GRPO plan's learners and
    engines fit, where they do not fit the nodes it holds (None: they fit, the plan is not a
    GRPO one, verl's takes every GPU it finds, or the cluster never grows)."""
    held = cluster.held
    grows = allocator(cluster.backend).remote and (cluster.max_nodes or 0) > held[0]
    if plan.kind != "grpo" or plan.framework == "verl" or not grows or not held[1] or not held[2]:
        return None
    args = (plan.learners, plan.engines, plan.tp, plan.per_bundle, plan.cpus_per_learner_gpu)
    for nodes in range(held[0], (cluster.max_nodes or 0) + 1):
        try:
            plan_grpo(Shape(nodes, held[1], held[2]), *args)
        except (Infeasible, ConfigError):
            continue
        return nodes if nodes > held[0] else None
    return None


def shape_of(cluster: ClusterRecord) -> Shape:
    """The nodes the cluster holds (grown ones of its shape too), their GPUs and CPUs."""
    return Shape(*cluster.held)


def layout_for(plan: PlanSpec, cluster: ClusterRecord, source: str) -> GrpoLayout:
    """The layout on this cluster; ConfigError with the reason and the nearest fit if none."""
    shape = shape_of(cluster)
    if not shape.gpus_per_node or not shape.cpus_per_node:
        raise ConfigError(
            f"{source}: field 'plan': {cluster.title} has {shape.gpus_per_node} GPUs and "
            f"{shape.cpus_per_node} CPUs per node: a GRPO plan needs both"
        )
    try:
        if plan.framework == "verl":  # its hybrid engine: actor and rollout share every GPU
            return plan_colocated(shape, plan.tp)
        return plan_grpo(
            shape, plan.learners, plan.engines, plan.tp, plan.per_bundle, plan.cpus_per_learner_gpu
        )
    except Infeasible as exc:
        fix = f"; nearest that fits: {exc.nearest.summary()}" if exc.nearest else ""
        raise ConfigError(f"{source}: field 'plan': {exc.reason} on {cluster.title}{fix}") from None


def values(layout: GrpoLayout, framework: str) -> dict[str, str]:
    flags = {"open-instruct": layout.open_instruct, "verl": layout.verl, "openrlhf": layout.openrlhf}[
        framework
    ]()
    return {
        "flags": shlex.join(flags),
        "num_learners_per_node": " ".join(map(str, layout.learner_bundles)),
        "vllm_num_engines": str(layout.engines),
        "vllm_tensor_parallel_size": str(layout.tp),
        "single_gpu_mode": "--single_gpu_mode" if layout.single_gpu else "",
        "learners": str(layout.learners),
        "engines": str(layout.engines),
        "nodes": str(layout.shape.nodes),
        "gpus_per_node": str(layout.shape.gpus_per_node),
    }


def batch_values(plan: PlanSpec, processes: int | None, source: str) -> dict[str, str]:
    if not plan.old:
        raise ConfigError(f"{source}: field 'plan.old': a batch plan needs the old run, e.g. old: 1x8x64")
    procs = plan.processes or processes
    if not procs:
        raise ConfigError(f"{source}: field 'plan.processes': give the new run's processes (GPUs)")
    old_procs, old_micro, old_accum = (int(x) for x in plan.old.split("x"))
    batch = keep_effective_batch(old_procs, old_micro, old_accum, procs, plan.micro)
    return {
        "grad_accum": str(batch.grad_accum),
        "micro_batch": str(batch.micro_batch),
        "processes": str(batch.processes),
        "effective": str(batch.effective),
        "difference": f"{batch.difference:+.1%}",
    }


def substitute(
    entrypoint: str, plan: PlanSpec | None, cluster: ClusterRecord, source: str, processes: int | None = None
) -> str:
    """The entrypoint with its {plan.*} placeholders filled for this cluster (`processes`: an SPMD
    job's, for a batch plan)."""
    if plan is None:
        if PLACEHOLDER.search(entrypoint):
            raise ConfigError(f"{source}: entrypoint uses {{plan.*}} but the spec has no 'plan:'; add one")
        return entrypoint
    if plan.kind == "batch":
        filled = batch_values(plan, processes, source)
    else:
        filled = values(layout_for(plan, cluster, source), plan.framework)
    for name in PLACEHOLDER.findall(entrypoint):
        if name not in filled:
            known = ", ".join(sorted(filled))
            raise ConfigError(
                f"{source}: entrypoint: {{plan.{name}}} is not a {plan.kind} plan value; use one of {known}"
            )
    return PLACEHOLDER.sub(lambda m: filled[m.group(1)], entrypoint)


def describe(plan: PlanSpec, cluster: ClusterRecord, source: str, processes: int | None = None) -> str:
    """One line: what the plan comes to on this cluster (printed by `raystack submit`)."""
    if plan.kind == "batch":
        v = batch_values(plan, processes, source)
        return (
            f"effective batch {v['processes']} x {v['micro_batch']} x {v['grad_accum']} = {v['effective']} "
            f"(was {plan.old}: {v['difference']})"
        )
    return f"{layout_for(plan, cluster, source).summary()} ({plan.framework})"


def plan_line(cluster: ClusterRecord, request: JobRequest) -> str:
    """What a resolved job's plan comes to on the part of the cluster it occupies ("" without
    a plan): the line `submit` and `check` print."""
    if not request.plan:
        return ""
    plan = PlanSpec.model_validate(request.plan)
    return describe(plan, occupied(cluster, request.needs), f"job {request.id}", request.processes)
