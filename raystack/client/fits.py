"""What a partition can hold, as sinfo lists it: a request it cannot is refused before sbatch, and
where SLURM refused one in words that name no number (`Node count specification invalid`,
`Invalid feature specification`), sinfo's numbers and names are added."""

from __future__ import annotations

import difflib
import re

from raystack.adapters.allocator import NodeShape, allocator
from raystack.errors import ConfigError, NoSuchPartition, SchedulerError
from raystack.spec.values import size_to_mb


def within(shape: NodeShape, nodes: int, gpus: int, cpus: int | None) -> None:
    """Refuse what the partition (as sinfo lists it) cannot hold, before SLURM answers with
    `More processors requested than permitted` or `Requested node configuration is not available`."""
    partition = f"partition {shape.partition}"
    if nodes > shape.nodes:
        raise ConfigError(
            f"--nodes {nodes}: {partition} has {shape.nodes} node(s) (sinfo); ask at most {shape.nodes}"
        )
    if not shape.uniform:  # (shape holds the smallest node's counts: a larger one may fit them)
        return
    for option, asked, has, what in (
        ("--gpus-per-node", gpus, shape.gpus, "GPUs"),
        ("--cpus-per-task", cpus, shape.cpus, "CPUs"),
    ):
        if asked is not None and asked > has:
            raise ConfigError(
                f"{option} {asked}: {partition}'s nodes have {has} {what} (sinfo); ask at most {has}"
            )


def why_refused(
    partition: str | None,
    nodes: int,
    gpus: int,
    cpus: int | None,
    mem: str | None,
    constraint: str | None,
    backend: str = "slurm",
) -> str:
    """What sinfo says a refused request does not fit (SLURM's own words name no number: `Node
    count specification invalid`, `Memory specification can not be satisfied`), as '; ...'; ''
    when sinfo sees no misfit or cannot say."""
    try:
        shape = allocator(backend).node_shape(partition)
        if shape is None:
            return ""
        within(shape, nodes, gpus, cpus)
        asked = size_to_mb(mem or "0")  # (sbatch's --mem units)
    except (ConfigError, NoSuchPartition) as exc:
        return f"; {exc}"
    except (SchedulerError, ValueError):
        return ""
    if asked and shape.mem_mb is not None and asked > shape.mem_mb:
        return (
            f"; --mem {mem}: partition {shape.partition}'s nodes have {shape.mem_mb} MB "
            f"({shape.mem_mb / 1024:.0f}G, sinfo); ask at most {shape.mem_mb}M, or --mem 0 for all of it"
        )
    return unknown_features(constraint, shape)


def unknown_features(constraint: str | None, shape: NodeShape) -> str:
    """'; --constraint X: no node of the partition has feature 'X' ...' for a feature name no
    node lists (SLURM says only `Invalid feature specification`); '' otherwise."""
    if not constraint or shape.features is None:
        return ""
    names = [re.sub(r"\*\d+$", "", n.strip()) for n in re.split(r"[&|,()\[\]]", constraint)]
    unknown = [n for n in names if n and n not in shape.features]
    if not unknown:
        return ""
    known = sorted(shape.features)
    has = ", ".join(known) or "none"
    same = [f for f in known if f.lower() == unknown[0].lower()]  # (H100 for h100)
    close = same or difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
    near = f"; did you mean {close[0]}?" + (" (names are case-sensitive)" if same else "") if close else ""
    return (
        f"; --constraint {constraint}: no node of partition {shape.partition} has feature "
        f"{unknown[0]!r} (their features, sinfo -o '%N %f': {has}){near}"
    )
