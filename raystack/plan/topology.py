"""GRPO topology: learners and vLLM engines on a cluster's nodes, as open-instruct places them.

open-instruct (grpo_fast.py, vllm_utils.py) asks for one placement group bundle per entry of
`--num_learners_per_node`, `{GPU: n, CPU: 10 n}`, with STRICT_SPREAD (each bundle on its own
node), and one bundle per vLLM engine, `{GPU: TP, CPU: TP}`, with PACK (an engine's TP GPUs on
one node). A bundle that fits no node waits forever ("Waiting for placement group", open-instruct
#1431), so every layout is checked here against the nodes' GPUs AND CPUs before anything runs,
and an infeasible one is refused with the reason and the nearest layout that fits. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from raystack.errors import ConfigError

LEARNER_CPUS_PER_GPU = 10  # open-instruct's LEARNER_PLACEMENT_GROUP_CPU_PER_GPU
HELPER_CPUS = 3  # its DataPreparationActor (2) and ActorManager (1)


class Infeasible(ValueError):
    """A layout that cannot be placed; `nearest` is the closest one that can (or None)."""

    def __init__(self, reason: str, nearest: GrpoLayout | None = None):
        self.reason, self.nearest = reason, nearest
        hint = f"; nearest that fits: {nearest.summary()}" if nearest else ""
        super().__init__(reason + hint)


def plural(n: int, word: str) -> str:
    """1 node, 2 nodes."""
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class Shape:
    """The cluster: nodes, and the GPUs and CPUs each node gives Ray."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int

    def describe(self) -> str:
        return f"{plural(self.nodes, 'node')} x {self.gpus_per_node} GPUs x {self.cpus_per_node} CPUs"


@dataclass(frozen=True)
class GrpoLayout:
    """Where learners and engines go; `placement[i]` = (learner GPUs, engines) on node i."""

    shape: Shape
    learner_bundles: tuple[int, ...]  # GPUs per learner bundle = --num_learners_per_node
    engines: int
    tp: int
    single_gpu: bool = False
    placement: tuple[tuple[int, int], ...] = field(default=())

    @property
    def learners(self) -> int:
        return sum(self.learner_bundles)

    @property
    def gpus_used(self) -> int:
        return self.learners if self.single_gpu else self.learners + self.engines * self.tp

    def summary(self) -> str:
        bundles = " ".join(map(str, self.learner_bundles))
        mode = ", single_gpu_mode" if self.single_gpu else ""
        learners, engines = plural(self.learners, "learner"), plural(self.engines, "engine")
        return f"{learners} ({bundles}), {engines} x TP {self.tp}{mode}"

    # ------------------------------------------------------------------ the frameworks' flags
    def open_instruct(self) -> list[str]:
        flags = ["--num_learners_per_node", *map(str, self.learner_bundles)]
        flags += ["--vllm_num_engines", str(self.engines), "--vllm_tensor_parallel_size", str(self.tp)]
        return [*flags, "--single_gpu_mode"] if self.single_gpu else flags

    def verl(self) -> list[str]:
        """verl colocates actor and rollout on every GPU (its hybrid engine): nodes x GPUs."""
        return [
            f"trainer.nnodes={self.shape.nodes}",
            f"trainer.n_gpus_per_node={self.shape.gpus_per_node}",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={self.tp}",
        ]

    def openrlhf(self) -> list[str]:
        """OpenRLHF's Ray launcher (openrlhf.cli.train_ppo_ray, its dotted flags): actors on nodes of
        equal learner GPUs, engines apart."""
        per_node = self.learner_bundles[0] if self.learner_bundles else 0
        return [
            "--actor.num_nodes",
            str(len(self.learner_bundles)),
            "--actor.num_gpus_per_node",
            str(per_node),
            "--vllm.num_engines",
            str(self.engines),
            "--vllm.tensor_parallel_size",
            str(self.tp),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": asdict(self.shape),
            "learners": self.learners,
            "num_learners_per_node": list(self.learner_bundles),
            "vllm_num_engines": self.engines,
            "vllm_tensor_parallel_size": self.tp,
            "single_gpu_mode": self.single_gpu,
            "gpus_used": self.gpus_used,
            "gpus_idle": self.shape.nodes * self.shape.gpus_per_node - self.gpus_used,
            "placement": [
                {"node": i, "learner_gpus": lg, "engines": e} for i, (lg, e) in enumerate(self.placement)
            ],
            "open_instruct": self.open_instruct(),
            "verl": self.verl(),
            "openrlhf": self.openrlhf(),
        }


def place(
    shape: Shape,
    bundles: list[int],
    engines: int,
    tp: int,
    cpus_per_learner_gpu: int = LEARNER_CPUS_PER_GPU,
) -> GrpoLayout:
    """Check a layout the way Ray will place it; raise Infeasible with the reason.

    Learner bundles go one per node (STRICT_SPREAD), largest first on the nodes with the most
    room; engines then fill the GPUs left, whole engines per node (PACK)."""
    g, c = shape.gpus_per_node, shape.cpus_per_node
    if tp < 1 or engines < 0 or any(b < 1 for b in bundles):
        raise Infeasible("learner bundles and TP must be at least 1, engines at least 0")
    if not bundles:
        raise Infeasible("at least one learner is needed")
    if tp > g:
        raise Infeasible(f"an engine with TP {tp} needs {tp} GPUs on one node, but nodes have {g}")
    for b in bundles:
        if b > g:
            raise Infeasible(f"a learner bundle of {b} GPUs does not fit a node of {g} GPUs")
        if b * cpus_per_learner_gpu > c:
            raise Infeasible(
                f"a learner bundle of {b} GPUs asks {b * cpus_per_learner_gpu} CPUs "
                f"({cpus_per_learner_gpu} per GPU) but nodes have {c}"
            )
    if len(bundles) > shape.nodes:
        raise Infeasible(
            f"{len(bundles)} learner bundles need {len(bundles)} nodes (STRICT_SPREAD), "
            f"the cluster has {shape.nodes}"
        )
    free = [[g, c] for _ in range(shape.nodes)]
    learners_on = [0] * shape.nodes
    for i, b in enumerate(sorted(bundles, reverse=True)):
        free[i][0] -= b
        free[i][1] -= b * cpus_per_learner_gpu
        learners_on[i] = b
    engines_on = [0] * shape.nodes
    left = engines
    for i in sorted(range(shape.nodes), key=lambda n: -free[n][0]):
        fit = min(free[i][0] // tp, free[i][1] // tp, left)
        engines_on[i] = fit
        free[i][0] -= fit * tp
        free[i][1] -= fit * tp
        left -= fit
    if left:
        placed = engines - left
        raise Infeasible(
            f"{engines} engines of TP {tp} do not fit the GPUs the learners leave: {placed} fit "
            f"({shape.describe()}, learner bundles {bundles})"
        )
    if sum(cpus for _, cpus in free) < HELPER_CPUS:
        raise Infeasible(f"no room for open-instruct's helper actors ({HELPER_CPUS} CPUs) after the bundles")
    return GrpoLayout(
        shape, tuple(bundles), engines, tp, placement=tuple(zip(learners_on, engines_on, strict=True))
    )


def spread(learners: int, shape: Shape, per_bundle: int | None = None) -> list[int]:
    """Learners as bundles: `per_bundle` GPUs each, or spread evenly over as many nodes as
    needed (open-instruct's 7B run: 20 learners on 10 nodes -> ten bundles of 2)."""
    if per_bundle:
        full, rest = divmod(learners, per_bundle)
        return [per_bundle] * full + ([rest] if rest else [])
    nodes = min(shape.nodes, learners)
    while nodes > 1 and learners % nodes:
        nodes -= 1
    return [learners // nodes] * nodes


def plan_grpo(
    shape: Shape,
    learners: int,
    engines: int | None = None,
    tp: int = 1,
    per_bundle: int | None = None,
    cpus_per_learner_gpu: int = LEARNER_CPUS_PER_GPU,
) -> GrpoLayout:
    """The layout for `learners` learner GPUs and `engines` engines of TP `tp` (default: as many
    engines as fit the GPUs left). Raises Infeasible with the nearest layout that fits, and
    ConfigError for counts that are no layout at all (0 learners, TP 0)."""
    for what, value, least in (
        ("learners", learners, 1),
        ("tp", tp, 1),
        ("engines", engines, 0),
        ("per_bundle", per_bundle, 1),
        ("cpus_per_learner_gpu", cpus_per_learner_gpu, 0),
        ("nodes", shape.nodes, 1),
        ("gpus_per_node", shape.gpus_per_node, 1),
        ("cpus_per_node", shape.cpus_per_node, 1),
    ):
        if value is not None and value < least:
            raise ConfigError(f"{what}: {value} is less than {least}; use {least} or more")
    total = shape.nodes * shape.gpus_per_node
    if total == 1 and learners == 1:
        # open-instruct's --single_gpu_mode: one engine shares the learner's GPU.
        if (engines or 1) != 1 or tp != 1:
            raise Infeasible(
                f"one GPU holds one learner and one engine of TP 1 (--single_gpu_mode), not {engines} "
                f"engines of TP {tp}",
                GrpoLayout(shape, (1,), 1, 1, single_gpu=True, placement=((1, 1),)),
            )
        return GrpoLayout(shape, (1,), 1, 1, single_gpu=True, placement=((1, 1),))
    bundles = spread(learners, shape, per_bundle)
    try:
        place(shape, bundles, 0, tp, cpus_per_learner_gpu)  # the learners alone first: the true reason
        if engines is None:
            engines = _free_after(shape, bundles, cpus_per_learner_gpu, tp)
            if engines == 0:
                raise Infeasible(
                    f"no GPU is left for a vLLM engine of TP {tp} after {learners} learners "
                    f"({shape.describe()})"
                )
        return place(shape, bundles, engines, tp, cpus_per_learner_gpu)
    except Infeasible as exc:
        # Without an engine count, the nearest layout aims at as many engine GPUs as learner GPUs.
        target = engines if engines else max(1, learners // tp)
        raise Infeasible(exc.reason, nearest(shape, learners, target, tp, cpus_per_learner_gpu)) from None


def _free_after(shape: Shape, bundles: list[int], cpus_per_learner_gpu: int, tp: int = 1) -> int:
    """Whole engines of TP `tp` that fit once the learner bundles are placed (0 if they do not):
    an engine's GPUs must be on one node."""
    try:
        layout = place(shape, bundles, 0, 1, cpus_per_learner_gpu)
    except Infeasible:
        return 0
    return sum(
        min((shape.gpus_per_node - used) // tp, (shape.cpus_per_node - used * cpus_per_learner_gpu) // tp)
        for used, _ in layout.placement
    )


def plan_colocated(shape: Shape, tp: int) -> GrpoLayout:
    """verl's hybrid engine: the actor and the rollout share every GPU of every node."""
    if tp > shape.gpus_per_node:
        raise Infeasible(
            f"a rollout with TP {tp} needs {tp} GPUs on one node, but nodes have {shape.gpus_per_node}"
        )
    if shape.gpus_per_node % tp:
        raise Infeasible(f"TP {tp} does not divide the {shape.gpus_per_node} GPUs of a node")
    g = shape.gpus_per_node
    return GrpoLayout(
        shape,
        tuple([g] * shape.nodes),
        shape.nodes * g // tp,
        tp,
        placement=tuple((g, g // tp) for _ in range(shape.nodes)),
    )


def nearest(
    shape: Shape, learners: int, engines: int, tp: int, cpus_per_learner_gpu: int = LEARNER_CPUS_PER_GPU
) -> GrpoLayout | None:
    """The feasible layout closest to the one asked (fewest learners and engines changed; then
    the most GPUs used), trying every bundle size and count and as many engines as fit."""
    best: tuple[tuple[float, int], GrpoLayout] | None = None
    g = shape.gpus_per_node
    for tp_ in sorted({min(tp, g), *(t for t in (1, 2, 4, 8) if t <= g)}, key=lambda t: abs(t - tp)):
        for size in range(1, g + 1):
            for count in range(1, min(shape.nodes, 2 * max(1, learners)) + 1):
                bundles = [size] * count
                room = _free_after(shape, bundles, cpus_per_learner_gpu, tp_)
                for e in {min(engines, room), room}:
                    if e < 1:
                        continue
                    try:
                        layout = place(shape, bundles, e, tp_, cpus_per_learner_gpu)
                    except Infeasible:
                        continue
                    cost = (  # squared relative changes: a balanced compromise beats a lopsided one
                        (abs(layout.learners - learners) / max(1, learners)) ** 2
                        + (abs(e - engines) / max(1, engines)) ** 2
                        + (0 if tp_ == tp else 1),
                        -layout.gpus_used,
                    )
                    if best is None or cost < best[0]:
                        best = (cost, layout)
    return best[1] if best else None


def nodes_wanted(needs: dict[str, Any], held: tuple[int, int, int]) -> int | None:
    """Whole nodes a job's `needs` occupies on nodes of the held shape (nodes, GPUs and CPUs
    each: `ClusterRecord.held`); None when it declares nothing (the whole cluster)."""
    nodes, gpus, cpus = needs.get("nodes"), needs.get("gpus"), needs.get("cpus")
    _, gpus_per_node, cpus_per_node = held
    if nodes is not None:
        return nodes
    counts = []
    if gpus:
        counts.append(math.ceil(gpus / gpus_per_node) if gpus_per_node else 10**9)
    if cpus:
        counts.append(math.ceil(cpus / cpus_per_node) if cpus_per_node else 1)
    if not counts and gpus == 0 and cpus is None:
        return 1  # (needs: {gpus: 0}: a CPU job that says it is small)
    return max(counts) if counts else None
