"""Verbs about clusters: up, wait, env, status, list, down."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Annotated

import typer
from rich.table import Table

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
from raystack.client import Cluster, ClusterRecord, allocate
from raystack.client.cluster import allocation_place, up_again
from raystack.client.pending import expected_start
from raystack.client.status import grown_lines, interconnect
from raystack.errors import ClusterError, ConfigError, SchedulerMissing, SchedulerUnavailable
from raystack.plan.topology import plural
from raystack.spec.profile import CANARY_MODES, Profile, load_profile
from raystack.spec.profile import idle_timeout as parse_idle_timeout
from raystack.spec.values import duration_text, off_or_duration

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
SbatchOpt = Annotated[
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
    sbatch: SbatchOpt = None,
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
        "extra_sbatch": sbatch,
        "chain": chain,
        "signal_lead": signal_lead,
    }
    if local_:
        _refuse_scheduler_options(nodes, {**scheduler_options, **asdict(site), "max_nodes": max_nodes})
        _up_local(gpus, cpus, prof, name or "local", dry_run, no_wait, wait_s, (as_json, parsable))
        return
    if gpus is not None or cpus is not None:
        raise ConfigError("--gpus/--cpus are for --local; on SLURM use --gpus-per-node/--cpus-per-task")
    plan = _plan_on_scheduler(nodes, prof, name or "default", scheduler_options)
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
    flags = {"extra_sbatch": "--sbatch", "gpu_type": "--gpus-per-node"}
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
    if dry_run:
        if as_json:
            print_json({"argv": plan.argv(), "script": allocate.render_script(plan)})
        else:
            print(f"# {plan.argv()[0]} argv:\n" + shlex.join(plan.argv()))
            print(f"# script ({plan.script_path}):\n" + allocate.render_script(plan), end="")
        return
    record = allocate.submit(plan)
    if not as_json:
        err.print(f"{record.message} for cluster {record.name}", markup=False)
    if not no_wait:  # (the handle only for waiting: --no-wait shows what was submitted)
        say = (lambda _m: None) if as_json else (lambda m: err.print(f"  {m}"))
        cluster = Cluster(record.name, record)
        with on_interrupt(lambda: still_starting(record.name)):
            cluster.wait_ready(progress=say, timeout=timeout)
        record = cluster.snapshot()
    _show_ready(record, as_json, parsable)


def _up_local(
    gpus: int | None,
    cpus: int | None,
    profile: Profile,
    name: str,
    dry_run: bool,
    no_wait: bool,
    timeout: float | None,
    how: tuple[bool, bool],
) -> None:
    as_json, parsable = how
    plan, gpu_ids = Cluster.plan_local(gpus=gpus, cpus=cpus, profile=profile, name=name)
    if dry_run:
        script = allocate.render_script(plan, gpu_ids)
        if as_json:
            print_json({"script": script})
        else:
            print(f"# script ({plan.script_path}):\n" + script, end="")
        return
    cluster = Cluster.start_local(plan, gpu_ids)
    record = cluster.snapshot()
    if not as_json:
        err.print(
            f"started cluster {name} on this machine ({record.allocation_id}): "
            f"{plan.gpus_per_node} GPUs, {plan.cpus_per_task} CPUs"
        )
    if not no_wait:
        say = (lambda _m: None) if as_json else (lambda m: err.print(f"  {m}"))
        with on_interrupt(lambda: still_starting(name)):
            cluster.wait_ready(progress=say, timeout=timeout)
    _show_ready(cluster.snapshot(), as_json, parsable)


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
    said = interconnect(record)
    if said:
        (err if "WARNING" in said else out).print(said, markup=False, soft_wrap=True)
    out.print(f"dashboard: {record.dashboard_url}  (token: raystack dashboard {name})")
    out.print(f"tunnel:    {Cluster(name, record).tunnel()['tunnel']}", markup=False, soft_wrap=True)
    out.print(f'env:       eval "$(raystack env {name})"')


@app.command(short_help="The ssh tunnel and login for the Ray dashboard.")
def dashboard(
    name: NameArg = None,
    cluster: ClusterOpt = None,
    login_host: Annotated[
        str | None, typer.Option("--login-host", help="Host to ssh to (default: this one).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """How to open the Ray dashboard from your laptop: the ssh tunnel line and how to log in."""
    info = Cluster.get(cluster_name(name, cluster)).tunnel(login_host)
    if as_json:
        print_json(info)
        return
    out.print(f"1. on your laptop:  {info['tunnel']}", markup=False, soft_wrap=True)
    out.print(f"2. open:            {info['url']}", markup=False, soft_wrap=True)
    if "tunnel_url" in info:  # (a local cluster: its URL works here, the tunnel's from elsewhere)
        out.print(f"   (from another machine, through the tunnel: {info['tunnel_url']})", markup=False)
    out.print(f"3. its token, here: {info['login']}", markup=False, soft_wrap=True)
    if "certificate" in info:
        out.print(f"   the certificate: {info['certificate']}", markup=False, soft_wrap=True)


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


@app.command(short_help="Exports for plain `ray job submit` and `ray status`.")
def env(name: NameArg = None, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """Print the exports with which plain `ray job submit` and `ray status` reach the cluster."""
    values = Cluster.get(cluster_name(name, cluster)).env()
    if as_json:
        print_json(values)
    else:
        for key, value in values.items():
            print(f"export {key}={shlex.quote(value)}")


@app.command(short_help="SLURM state, time left, nodes, GPUs (exit 1 unless ready).")
def status(name: NameArg = None, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """SLURM state and time left, Ray nodes alive/expected, GPUs and CPUs. Exit 1 unless ready."""
    st = Cluster.get(cluster_name(name, cluster)).status()
    if as_json:
        print_json(st.to_dict())
    else:
        left = (
            "-" if st.time_left_s is None else f"{st.time_left_s // 3600}h{st.time_left_s % 3600 // 60:02d}m"
        )
        table = Table(show_header=False, box=None)
        allocation = "-"  # (none yet: its `up` is submitting it, or stopped before it had one)
        if st.allocation_id:
            allocation = (
                f"{'job ' if st.backend == 'slurm' else ''}{st.allocation_id} {st.allocation_state or '?'}"
            )
            if st.allocation_state == "PENDING":
                allocation += (
                    f" ({st.allocation_reason}){expected_start(st.allocation_expected_start, time.time())}"
                )
        rows = [
            ("cluster", st.name),
            ("state", f"{st.state}  {st.message}"),
            ("slurm" if st.backend == "slurm" else "allocation", allocation),
            ("time left", left),
            (
                "nodes",
                f"{'-' if st.nodes_alive is None else st.nodes_alive}/{st.nodes_expected} alive",
            ),
            ("GPUs", f"{st.gpus if st.gpus is not None else '-'}"),
            ("CPUs", f"{st.cpus if st.cpus is not None else '-'}"),
            ("dashboard", "-" if st.ended else st.dashboard_url or "-"),  # (stale once ended)
            ("jobs", f"running {st.running_job or '-'}, {st.queued_jobs} queued"),
        ]
        if st.chain_count > 1:
            nxt = (
                f"; next: job {st.next_allocation_id} {st.next_state or '?'}"
                + (f" ({st.next_reason})" if st.next_reason and st.next_reason != "None" else "")
                if st.next_allocation_id
                else ""
            )
            rows.insert(4, ("chain", f"allocation {st.chain_index} of {st.chain_count}{nxt}"))
        if st.state == "READY" and (st.idle_s is not None or st.idle_timeout_s):
            idle = "busy" if st.idle_s is None else f"idle {duration_text(st.idle_s)}"
            auto = f"autostop after {duration_text(st.idle_timeout_s)} idle" if st.idle_timeout_s else ""
            rows.append(("idle", f"{idle}{'; ' + auto if auto else ''}"))
        rows += [("metrics", f"Prometheus on the head at {st.prometheus}")] if st.prometheus else []
        if st.interconnect:
            rows.append(("interconnect", st.interconnect.removeprefix("interconnect: ")))
        rows += [("grown", line) for line in grown_lines(st)]
        if st.resuming_jobs:
            rows.append(("resumes", ", ".join(st.resuming_jobs)))
        if st.ray_error:
            rows.append(("ray", st.ray_error))
        for key, value in rows:
            table.add_row(key, str(value))
        out.print(table)
    if not st.ready:
        raise typer.Exit(1)


@app.command("list", short_help="Every known cluster and its state.")
def list_(as_json: JsonOpt = False) -> None:
    """Every known cluster and its state."""
    records = Cluster.list()
    if as_json:
        print_json([r.model_dump(mode="json") for r in records])
        return
    table = Table("name", "state", "allocation", "nodes", "GPUs/node", "dashboard", "message")
    for r in records:
        table.add_row(
            r.name,
            r.state.value,
            r.allocation_id or "-",
            str(r.nodes_expected),
            str(r.gpus_per_node),
            "-" if r.state.is_terminal() else r.dashboard_url or "-",  # (an ended one's is stale)
            r.message,
        )
    if not records:
        err.print(Cluster.none_here(), markup=False)
        return
    out.print(table)


YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _confirm(question: str, yes: bool) -> None:
    """Ask on a terminal; without one, --yes is needed (nothing is done on a guess)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfigError(f"{question} Not on a terminal: add --yes to confirm")
    if not typer.confirm(question, default=False, err=True):
        raise typer.Exit(1)


WITH = {"STOPPED": "stopped with it"}  # down's words for a job in flight, by its state after


@app.command(short_help="Stop a cluster (or --all) and release its nodes.")
def down(
    name: NameArg = None,
    cluster: ClusterOpt = None,
    every: Annotated[bool, typer.Option("--all", help="Every live cluster (asks first).")] = False,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Cancel the allocation (and a chain's pending one), wait until SLURM has released the nodes,
    and mark the cluster STOPPED; jobs still queued stay queued for the next `up` of the name."""
    if every:
        if name or cluster:
            raise ConfigError("down --all: give no cluster name with --all")
        live = [r for r in Cluster.list() if not r.state.is_terminal()]
        if not live:
            err.print("raystack: no live cluster", markup=False)
            return
        names = ", ".join(f"{r.name} ({r.state.value})" for r in live)
        _confirm(f"Stop {len(live)} cluster(s): {names}?", yes)
        handles = [Cluster(r.name) for r in live]
    else:
        handles = [Cluster.get(cluster_name(name, cluster))]
    running = {h.name: h.in_flight() for h in handles}
    done = [h.down() for h in handles]
    if as_json:
        print_json([r.model_dump(mode="json") for r in done] if every else done[0].model_dump(mode="json"))
        return
    for handle, record in zip(handles, done, strict=True):
        out.print(f"cluster {record.name}: {record.state.value} ({record.message})")
        if ids := running[record.name]:  # (a local cluster whose node program was killed failed them)
            said = ((s, ", ".join(j)) for s, j in handle.states_of(ids).items())
            err.print(
                "  " + "; ".join(f"{WITH.get(s, 'ended before it')} ({s}): {j}" for s, j in said),
                markup=False,
            )
        if waiting := len(handle.positions()):
            err.print(
                f"  {waiting} queued job(s) stay queued: `{up_again(record)}` runs them",
                markup=False,
            )


@app.command(short_help="Remove ended clusters' folders (record, ledger, logs).")
def forget(
    names: Annotated[list[str], typer.Argument(metavar="CLUSTER", help="Ended clusters to remove.")],
    yes: YesOpt = False,
) -> None:
    """Remove the folder of each ended cluster: its record, token, queue, ledger and every log.
    A live cluster is refused (`raystack down` it first)."""
    handles = [Cluster.get(n) for n in dict.fromkeys(names)]
    live = [h.name for h in handles if not h.snapshot().state.is_terminal()]
    if live:
        raise ConfigError(f"forget: {', '.join(live)} still live: `raystack down {live[0]}` first")
    _confirm(f"Remove {', '.join(h.name for h in handles)} with its ledger and logs?", yes)
    for handle in handles:
        out.print(f"removed {handle.forget()}", markup=False)
