"""`raystack plan grpo|memory|batch`: the planner's arithmetic, from the command line."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from raystack.cli.common import JsonOpt, app, out, print_json
from raystack.client import Cluster
from raystack.errors import ConfigError
from raystack.plan import memory as mem
from raystack.plan.batch import keep_effective_batch
from raystack.plan.topology import LEARNER_CPUS_PER_GPU, Infeasible, Shape, plan_grpo

plan_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Layouts, memory and batch arithmetic for GRPO and SPMD runs (no cluster needed).",
)
app.add_typer(plan_app, name="plan", short_help="GRPO layouts, memory and batch arithmetic (no cluster).")

ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", "-c", metavar="NAME", help="Take the shape of this cluster.")
]


def cluster_shape(cluster: str | None, nodes: int | None, gpus: int | None, cpus: int | None) -> Shape:
    if cluster:
        record = Cluster.get(cluster).record()
        return Shape(*record.held)
    if not (nodes and gpus and cpus):
        given = {"--nodes": nodes, "--gpus-per-node": gpus, "--cpus-per-node": cpus}
        missing = " and ".join(k for k, v in given.items() if not v)
        raise ConfigError(
            f"plan grpo: give --cluster NAME, or --nodes, --gpus-per-node and --cpus-per-node ({missing} "
            "missing; e.g. Isambard's GH200 nodes: --gpus-per-node 4 --cpus-per-node 288)"
        )
    return Shape(nodes, gpus, cpus)


@plan_app.command("grpo")
def grpo(
    learners: Annotated[int, typer.Option(min=1, help="Learner GPUs (the DeepSpeed world size).")],
    engines: Annotated[
        int | None, typer.Option(min=0, help="vLLM engines.  [default: as many as fit]")
    ] = None,
    tp: Annotated[int, typer.Option(min=1, help="vLLM tensor parallel size per engine.")] = 1,
    per_bundle: Annotated[
        int | None, typer.Option(min=1, help="Learner GPUs per bundle.  [default: spread]")
    ] = None,
    cpus_per_learner_gpu: Annotated[int, typer.Option(min=0)] = LEARNER_CPUS_PER_GPU,
    cluster: ClusterOpt = None,
    nodes: Annotated[int | None, typer.Option(min=1)] = None,
    gpus_per_node: Annotated[int | None, typer.Option(min=1)] = None,
    cpus_per_node: Annotated[int | None, typer.Option(min=1)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Learners and vLLM engines on the nodes, as open-instruct, verl and OpenRLHF flags."""
    shape = cluster_shape(cluster, nodes, gpus_per_node, cpus_per_node)
    try:
        layout = plan_grpo(shape, learners, engines, tp, per_bundle, cpus_per_learner_gpu)
    except Infeasible as exc:
        fix = f"; nearest that fits: {exc.nearest.summary()}" if exc.nearest else ""
        if as_json:
            print_json(
                {
                    "feasible": False,
                    "reason": exc.reason,
                    "nearest": exc.nearest.to_dict() if exc.nearest else None,
                }
            )
            raise typer.Exit(1) from None
        raise ConfigError(f"plan grpo: {exc.reason}{fix}") from None
    if as_json:
        print_json({"feasible": True, **layout.to_dict()})
        return
    table = Table(
        "node", "learner GPUs", "engines", "GPUs idle", title=f"{shape.describe()}: {layout.summary()}"
    )
    for i, (lg, e) in enumerate(layout.placement):
        table.add_row(str(i), str(lg), f"{e} x TP {layout.tp}", str(shape.gpus_per_node - lg - e * layout.tp))
    out.print(table)
    out.print("open-instruct: " + " ".join(layout.open_instruct()), markup=False)
    out.print("verl:          " + " ".join(layout.verl()), markup=False)
    out.print("OpenRLHF:      " + " ".join(layout.openrlhf()), markup=False)


@plan_app.command("memory")
def memory(
    model: Annotated[str, typer.Option(help="A known model (7b, 32b, qwen2.5-7b, ...).")] = "7b",
    learners: Annotated[int, typer.Option(min=1, help="ZeRO-3 learners sharing the model.")] = 2,
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per sequence (prompt + response).")] = 4096,
    micro_batch: Annotated[int, typer.Option(min=1)] = 1,
    gpu_memory: Annotated[float, typer.Option(min=1, help="GB per GPU (GH200: 95).")] = 95.0,
    optimizer_bytes: Annotated[int, typer.Option(help="12: fp32 master + Adam m, v; 8: m, v only.")] = 12,
    engine_tp: Annotated[int, typer.Option(min=1, help="vLLM tensor parallel size.")] = 1,
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.01, max=1.0)] = 0.9,
    as_json: JsonOpt = False,
) -> None:
    """Memory per learner GPU under ZeRO-3, and per GPU of a vLLM engine."""
    try:
        m = mem.model(model)
        learner = mem.learner_memory(m, learners, seq_len, micro_batch, gpu_memory, optimizer_bytes)
        engine = mem.engine_memory(m, engine_tp, gpu_memory_utilization, gpu_memory, seq_len)
    except ValueError as exc:
        raise ConfigError(f"plan memory: {exc}") from None
    if as_json:
        print_json({"learner": learner.to_dict(), "engine": engine.to_dict()})
        return
    table = Table(
        "per learner GPU",
        "GB",
        title=f"{m.name} on {learners} ZeRO-3 learners, seq {seq_len} x {micro_batch}",
    )
    for label, value in (
        ("parameters (bf16 shard)", learner.parameters),
        ("gradients (bf16 shard)", learner.gradients),
        (f"optimizer ({optimizer_bytes} B/param shard)", learner.optimizer),
        ("live gathered parameters", learner.live_parameters),
        ("activations (checkpointed)", learner.activations),
        ("total", learner.total),
    ):
        table.add_row(label, f"{value:.1f}")
    out.print(table)
    out.print(f"{learner.total:.0f} GB of {gpu_memory:.0f} GB ({learner.fraction:.0%})", markup=False)
    if learner.warning:
        out.print(f"warning: {learner.warning}", markup=False)
    verdict = "fits" if engine.fits else "does NOT fit: raise the TP or gpu_memory_utilization"
    out.print(
        f"vLLM engine TP {engine_tp} at gpu_memory_utilization {gpu_memory_utilization}: "
        f"{engine.weights_per_gpu:.1f} GB weights + {engine.kv_cache_per_gpu:.1f} GB KV cache per GPU "
        f"({engine.max_tokens:,} tokens, {engine.max_sequences} sequences of {seq_len}); {verdict}",
        markup=False,
    )


@plan_app.command("batch")
def batch(
    old: Annotated[str, typer.Option(help="processes x micro-batch x accumulation, e.g. 1x8x64.")],
    new_processes: Annotated[int, typer.Option(min=1, help="GPUs (processes) of the new run.")],
    new_micro: Annotated[
        int | None, typer.Option(min=1, help="Micro-batch of the new run.  [default: the old]")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The gradient accumulation that keeps the effective batch on a new GPU count."""
    try:
        procs, micro, accum = (int(x) for x in old.lower().split("x"))
    except ValueError:
        raise ConfigError(
            f"plan batch: --old {old!r}: use processes x micro-batch x accumulation, e.g. 1x8x64"
        ) from None
    try:
        plan = keep_effective_batch(procs, micro, accum, new_processes, new_micro)
    except ValueError as exc:
        raise ConfigError(f"plan batch: {exc}") from None
    if as_json:
        print_json(plan.to_dict())
        return
    same = "the same" if plan.exact else f"{plan.difference:+.1%}"
    out.print(
        f"{procs} x {micro} x {accum} = {plan.target} -> {plan.processes} x {plan.micro_batch} x "
        f"{plan.grad_accum} = {plan.effective} ({same}): gradient_accumulation_steps={plan.grad_accum}",
        markup=False,
    )
