"""`raystack up` and `raystack wait`: up's options (the scheduler's letters beside raystack's own),
the plan, the start on the scheduler or on this machine (--local), and the wait until READY."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Annotated

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
    on_interrupt,
    out,
    print_json,
)
from raystack.cli.options import CanaryOpt, IdleTimeoutOpt, MaxNodesOpt, MetricsOpt, NoCanaryOpt
from raystack.client import Cluster, ClusterRecord, allocate, submission
from raystack.client.cluster import allocation_place
from raystack.client.status import interconnect
from raystack.errors import ClusterError, ConfigError, SchedulerMissing, SchedulerUnavailable
from raystack.plan.topology import plural
from raystack.spec.profile import CANARY_MODES, Profile, load_profile
from raystack.spec.profile import idle_timeout as parse_idle_timeout
from raystack.spec.values import off_or_duration

# The options of `up`, one alias each (the signature stays readable). sbatch's letters mean what
# they mean in sbatch (-N -t -p -A -J -q -C -c); the profile is -P.
NodesOpt = Annotated[int, typer.Option("--nodes", "-N", min=1, metavar="N", help="Nodes.")]


ProfileOpt = Annotated[
    str,
    typer.Option(
        "--profile",
        "-P",
        metavar="NAME",
        help="Cluster profile (raystack profiles).",
        autocompletion=complete_profile,
    ),
]


NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name", "-J", "--cluster", metavar="NAME", help="Cluster name.  [default: default; --local: local]"
    ),
]


TimeOpt = Annotated[
    str | None,
    typer.Option(
        "--time",
        "-t",
        metavar="TIME",
        help="Walltime of each allocation: minutes, H:M:S, D-H:M:S, or 2h, 1d.  "
        "[default: the profile's; generic: 1:00:00]",
    ),
]


PartitionOpt = Annotated[str | None, typer.Option("--partition", "-p", metavar="NAME")]


AccountOpt = Annotated[str | None, typer.Option("--account", "-A", metavar="NAME")]


QosOpt = Annotated[str | None, typer.Option("--qos", "-q", metavar="NAME")]


MemOpt = Annotated[str | None, typer.Option("--mem", metavar="SIZE", help="Memory per node (0: all of it).")]


ExclusiveOpt = Annotated[bool, typer.Option("--exclusive", help="No other job on the nodes.")]


ConstraintOpt = Annotated[str | None, typer.Option("--constraint", "-C", metavar="LIST")]


ReservationOpt = Annotated[str | None, typer.Option("--reservation", metavar="NAME")]


GresOpt = Annotated[
    str | None, typer.Option("--gres", metavar="LIST", help="Generic resources beside the GPUs.")
]


GpusPerNodeOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus-per-node",
        metavar="[TYPE:]N",
        help="GPUs per node, e.g. 4 or h100:4.  [default: every GPU of the node (sinfo)]",
    ),
]


CpusPerTaskOpt = Annotated[
    int | None,
    typer.Option(
        "--cpus-per-task",
        "-c",
        min=1,
        metavar="N",
        help="CPUs per node.  [default: every CPU of the node (sinfo)]",
    ),
]


NativeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sbatch",
        metavar="OPTION",
        help="Any other sbatch option, e.g. --sbatch=--mail-type=END (repeatable).",
    ),
]


ChainOpt = Annotated[
    int | None,
    typer.Option(
        "--chain",
        min=1,
        metavar="K",
        help="Allocations in all: the cluster and its queue live across K walltimes.",
    ),
]


SignalLeadOpt = Annotated[
    str | None,
    typer.Option(
        "--signal-lead",
        metavar="TIME",
        help="Warn this long before each walltime end.  [default: the profile's, 10m; "
        "a quarter of a walltime not longer than that]",
    ),
]


DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the sbatch argv and script only.")]


NoWaitOpt = Annotated[bool, typer.Option("--no-wait", help="Return once submitted.")]


TimeoutOpt = Annotated[
    str | None, typer.Option("--timeout", metavar="TIME", help="Give up waiting after this long (e.g. 10m).")
]


LocalOpt = Annotated[bool, typer.Option("--local", help="A one-node cluster on this machine, without SLURM.")]


GpusOpt = Annotated[
    int | None,
    typer.Option("--gpus", min=0, metavar="N", help="With --local: GPUs to use.  [default: all visible]"),
]


CpusOpt = Annotated[
    int | None, typer.Option("--cpus", min=1, metavar="N", help="With --local: CPUs to use.  [default: all]")
]


TlsOpt = Annotated[
    bool, typer.Option("--tls", help="Mutual TLS between Ray's processes, HTTPS for the dashboard.")
]


@dataclass(frozen=True)
class SiteOptions:
    """The sbatch options of `up` that override the profile's site defaults."""

    qos: str | None = None
    mem: str | None = None
    exclusive: bool = False
    constraint: str | None = None
    reservation: str | None = None
    gres: str | None = None
    gpu_type: str | None = None

    def apply(self, prof: Profile) -> Profile:
        changes = {k: v for k, v in asdict(self).items() if v not in (None, False)}
        return prof.model_copy(update=changes) if changes else prof


@app.command(short_help="Start a cluster: one allocation running Ray; wait until READY.")
def up(
    nodes: NodesOpt = 1,
    profile: ProfileOpt = "generic",
    name: NameOpt = None,
    time: TimeOpt = None,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    mem: MemOpt = None,
    exclusive: ExclusiveOpt = False,
    constraint: ConstraintOpt = None,
    reservation: ReservationOpt = None,
    gres: GresOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    cpus_per_task: CpusPerTaskOpt = None,
    native: NativeOpt = None,
    chain: ChainOpt = None,
    signal_lead: SignalLeadOpt = None,
    dry_run: DryRunOpt = False,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = None,
    local_: LocalOpt = False,
    gpus: GpusOpt = None,
    cpus: CpusOpt = None,
    tls: TlsOpt = False,
    metrics: MetricsOpt = False,
    idle_timeout: IdleTimeoutOpt = None,
    max_nodes: MaxNodesOpt = None,
    canary: CanaryOpt = None,
    no_canary: NoCanaryOpt = False,
    as_json: JsonOpt = False,
    parsable: ParsableOpt = False,
) -> None:
    """Submit one allocation that runs a Ray cluster, and wait until it is READY."""
    gpu_type, gpu_count = _typed_gpus(gpus_per_node)
    site = SiteOptions(qos, mem, exclusive, constraint, reservation, gres, gpu_type)
    prof = _profile_with(load_profile(profile), tls, metrics, idle_timeout)
    prof = prof.model_copy(update={"max_nodes": max_nodes}) if max_nodes else prof
    prof = site.apply(_with_canary(prof, "off" if no_canary else canary))
    wait_s = _timeout(timeout)
    scheduler_options = {
        "time": time,
        "partition": partition,
        "account": account,
        "gpus_per_node": gpu_count,
        "cpus_per_task": cpus_per_task,
        "native": native,
        "chain": chain,
        "signal_lead": signal_lead,
    }
    if local_:  # (the local backend: this machine's share, and no scheduler's options)
        _refuse_scheduler_options(nodes, {**scheduler_options, **asdict(site), "max_nodes": max_nodes})
        scheduler_options = {"gpus_per_node": gpus, "cpus_per_task": cpus}
        prof = allocate.local_profile(prof)
    elif gpus is not None or cpus is not None:
        raise ConfigError("--gpus/--cpus are for --local; on SLURM use --gpus-per-node/--cpus-per-task")
    plan = _plan_on_scheduler(nodes, prof, name or ("local" if local_ else "default"), scheduler_options)
    _up_on_scheduler(plan, dry_run, no_wait, wait_s, (as_json, parsable))


def _plan_on_scheduler(
    nodes: int, prof: Profile, name: str, options: Mapping[str, object]
) -> allocate.AllocationPlan:
    """The allocation `up` submits; where SLURM does not answer, the error says nothing was."""
    try:
        return allocate.plan_on_partition(nodes, profile=prof, name=name, **options)
    except SchedulerMissing:  # (said with its fix)
        raise
    except SchedulerUnavailable as exc:
        why = f"SLURM did not answer ({exc}): nothing was submitted"
        raise ClusterError(f"{why}; `raystack up` again once `sinfo` works") from None


def _typed_gpus(value: str | None) -> tuple[str | None, int | None]:
    """--gpus-per-node N or TYPE:N (as sbatch takes it): (type or None, count or None)."""
    if value is None:
        return None, None
    kind, _, count = value.rpartition(":")
    if not count.strip().isdigit() or (":" in value and not kind.strip()):
        raise ConfigError(f"--gpus-per-node: {value!r} is not a GPU count; use e.g. 4 or h100:4")
    return kind.strip() or None, int(count)


def _timeout(value: str | None) -> float | None:
    """--timeout: a duration; 0 or off (or not given): wait as long as it takes."""
    if value is None:  # (as every option of up: parsed only when given)
        return None
    try:
        return off_or_duration(value)
    except ValueError as exc:
        raise ConfigError(f"--timeout: {exc}") from None


def _profile_with(prof: Profile, tls: bool, metrics: bool, idle_timeout: str | None) -> Profile:
    """The profile with `up`'s own switches applied."""
    changes: dict[str, object] = {"tls": True} if tls else {}
    if metrics:
        changes["metrics"] = True
    if idle_timeout is not None:
        try:
            changes["idle_timeout"] = parse_idle_timeout(idle_timeout)
        except ValueError as exc:
            raise ConfigError(f"--idle-timeout: {exc}") from None
    return prof.model_copy(update=changes) if changes else prof


def _with_canary(prof: Profile, mode: str | None) -> Profile:
    if mode is None:
        return prof
    if mode.lower() not in CANARY_MODES:
        raise ConfigError(f"--canary: {mode!r} is not a mode; use one of {', '.join(CANARY_MODES)}")
    return prof.model_copy(update={"canary": mode.lower()})


def _refuse_scheduler_options(nodes: int, options: Mapping[str, object]) -> None:
    """A --local cluster is one node without SLURM: name the first SLURM option given."""
    given = ["--nodes"] if nodes != 1 else []
    counts = ("gpus_per_node", "cpus_per_task")  # (0 is a value given)
    flags = {"native": "--sbatch", "gpu_type": "--gpus-per-node"}
    given += [
        flags.get(key, "--" + key.replace("_", "-"))
        for key, value in options.items()
        if (value is not None if key in counts else value)
    ]
    if given:
        fix = "use --gpus/--cpus" if given[0] in ("--gpus-per-node", "--cpus-per-task") else "drop it"
        if given[0] == "--max-nodes":
            fix = "it cannot grow: drop --max-nodes, or start a SLURM cluster to grow one"
        raise ConfigError(f"{given[0]}: a --local cluster is one node without SLURM; {fix}")


def _up_on_scheduler(
    plan: allocate.AllocationPlan, dry_run: bool, no_wait: bool, timeout: float | None, how: tuple[bool, bool]
) -> None:
    as_json, parsable = how
    if plan.note and not as_json:
        err.print(f"raystack: {plan.note}", markup=False)
    argv = plan.argv()  # (none where the backend starts it itself: --local)
    if dry_run:
        script = allocate.render_script(plan)
        if as_json:
            print_json({**({"argv": argv} if argv else {}), "script": script})
        else:
            if argv:
                print(f"# {argv[0]} argv:\n" + shlex.join(argv))
            print(f"# script ({plan.script_path}):\n" + script, end="")
        return
    record = submission.submit(plan)
    if not as_json:
        shares = "" if argv else f": {plan.gpus_per_node} GPUs, {plan.cpus_per_task} CPUs"
        err.print(f"{record.message} for cluster {record.name}{shares}", markup=False)
    if not no_wait:  # (the handle only for waiting: --no-wait shows what was submitted)
        say = (lambda _m: None) if as_json else (lambda m: err.print(f"  {m}"))
        cluster = Cluster(record.name, record)
        with on_interrupt(lambda: still_starting(record.name)):
            cluster.wait_ready(progress=say, timeout=timeout)
        record = cluster.snapshot()
    _show_ready(record, as_json, parsable)


def _show_ready(record: ClusterRecord, as_json: bool, parsable: bool = False) -> None:
    """A cluster as `up` and `wait` leave it: READY with its dashboard and tunnel, or where it is
    (--parsable: its allocation's id alone on stdout, the rest on stderr)."""
    name = record.name
    if as_json:
        print_json(record.model_dump(mode="json"))
        return
    if parsable:
        print(record.allocation_id, flush=True)
        if record.state.value != "READY":
            err.print(f"cluster {name}: {record.state.value} ({record.message})", markup=False)
        return
    if record.state.value != "READY":
        out.print(f"cluster {name}: {record.state.value} ({record.message})")
        out.print(f"follow it with: raystack status {name}")
        return
    out.print(
        f"cluster {name} READY: {allocation_place(record)}, {plural(record.nodes_expected, 'node')} "
        f"({', '.join(record.nodes)}), "
        f"{record.gpus_per_node * record.nodes_expected} GPUs"
    )
    canary = interconnect(record)
    if canary:
        (err if "WARNING" in canary else out).print(canary, markup=False, soft_wrap=True)
    out.print(f"dashboard: {record.dashboard_url}  (token: raystack dashboard {name})")
    out.print(f"tunnel:    {Cluster(name, record).tunnel()['tunnel']}", markup=False, soft_wrap=True)
    out.print(f'env:       eval "$(raystack env {name})"')


@app.command(short_help="Wait until a cluster is READY (exit 1 if it ends first).")
def wait(
    name: NameArg = None,
    cluster: ClusterOpt = None,
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait until a cluster (e.g. one started with --no-wait) is READY; exit 1 if it ends first."""
    handle = Cluster.get(cluster_name(name, cluster))
    say = (lambda _m: None) if as_json else (lambda m: err.print(f"  {m}"))
    with on_interrupt(lambda: still_starting(handle.name)):
        handle.wait_ready(progress=say, timeout=_timeout(timeout))
    _show_ready(handle.snapshot(), as_json)


def still_starting(name: str) -> str:
    """What a Ctrl-C of `up` or `wait` leaves going on: the allocation, and the commands for it."""
    record = Cluster(name).record()
    if record.state.is_terminal():
        return f"cluster {name} is {record.state.value}: {record.message}"
    return (
        f"cluster {name} is still {record.state.value} ({allocation_place(record)}); "
        f"wait again: raystack wait {name}, release it: raystack down {name}"
    )
