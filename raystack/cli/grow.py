"""`raystack grow` and `raystack shrink`: further allocations of workers for a running cluster."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from raystack.cli.common import (
    ClusterOpt,
    JsonOpt,
    NameArg,
    ParsableOpt,
    app,
    cluster_name,
    complete_profile,
    err,
    print_json,
)
from raystack.cli.up import (
    AccountOpt,
    GpusPerNodeOpt,
    NativeOpt,
    NodesOpt,
    NoWaitOpt,
    PartitionOpt,
    TimeOpt,
    TimeoutOpt,
    _timeout,
    _typed_gpus,
)
from raystack.client import Cluster
from raystack.client import grow as growing
from raystack.spec.profile import load_profile
from raystack.spec.values import duration_text, parse_duration

GrowProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-P",
        metavar="NAME",
        help="Profile of the new nodes (another partition's, another node shape).  [default: the cluster's]",
        autocompletion=complete_profile,
    ),
]
# (grow acts on an existing cluster: -c is --cluster, as on every such verb; `up`, which makes
# one, keeps sbatch's -c for --cpus-per-task)
GrowCpusOpt = Annotated[
    int | None,
    typer.Option("--cpus-per-task", min=1, metavar="N", help="CPUs per node.  [default: the cluster's]"),
]
AllocArg = Annotated[str, typer.Argument(metavar="ALLOC_ID", help="The grown allocation (raystack status).")]
DeadlineOpt = Annotated[
    str,
    typer.Option(
        "--deadline", metavar="DURATION", help="How long its nodes' work may take to finish once drained."
    ),
]


@app.command(short_help="Add nodes to a running cluster: a further allocation of Ray workers.")
def grow(
    name: NameArg = None,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = 1,
    profile: GrowProfileOpt = None,
    time: TimeOpt = None,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    cpus_per_task: GrowCpusOpt = None,
    native: NativeOpt = None,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
    parsable: ParsableOpt = False,
    auto: Annotated[bool, typer.Option("--for-queue", hidden=True)] = False,
) -> None:
    """Submit a further allocation whose nodes join the cluster as Ray workers (its token, TLS and
    session); wait until they are in Ray. It never gets a host the cluster holds. GPU nodes grown
    beside a head without GPUs are the nodes jobs count (needs, SPMD, plans; the drivers run on the
    head). `raystack shrink` releases it; `down` ends it too."""
    target = Cluster.get(cluster_name(name, cluster)).name
    gpu_type, gpu_count = _typed_gpus(gpus_per_node)
    options: dict[str, Any] = {
        "time": time,
        "partition": partition,
        "account": account,
        "gpus_per_node": gpu_count,
        "cpus_per_task": cpus_per_task,
        "native": native,
    }
    if profile or gpu_type:
        prof = load_profile(profile or Cluster.get(target).record().profile)
        options["profile"] = prof.model_copy(update={"gpu_type": gpu_type}) if gpu_type else prof
    entry = growing.grow(target, nodes, auto=auto, **options)
    if parsable:  # (the grown allocation's id alone on stdout, at once: `raystack shrink ID` takes it)
        print(entry.alloc_id, flush=True)
    if not as_json:
        err.print(
            f"cluster {target}: allocation {entry.alloc_id} submitted for {nodes} more node(s)", markup=False
        )
    if not no_wait:
        entry = growing.joined(target, entry.alloc_id, _timeout(timeout))
        if not as_json:
            err.print(
                f"cluster {target}: allocation {entry.alloc_id} joined: {', '.join(entry.hosts)}",
                markup=False,
            )
    if as_json:
        print_json(entry.model_dump())


@app.command(short_help="Release a grown allocation: drained through Ray, then ended.")
def shrink(
    alloc_id: AllocArg,
    name: NameArg = None,
    cluster: ClusterOpt = None,
    deadline: DeadlineOpt = "60s",
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Drain the allocation's Ray nodes (nothing new lands there), let their work finish (at most
    --deadline), then end the allocation."""
    target = Cluster.get(cluster_name(name, cluster)).name
    seconds = parse_duration(deadline)
    entry = growing.shrink(target, alloc_id, deadline=seconds, timeout=_timeout(timeout) or 300)
    if as_json:
        print_json(entry.model_dump())
    else:
        err.print(
            f"cluster {target}: allocation {alloc_id} released (drain deadline {duration_text(seconds)})",
            markup=False,
        )
