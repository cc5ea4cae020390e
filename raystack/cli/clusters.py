"""Verbs about clusters: up, wait, env, status, list, down."""

from __future__ import annotations

import shlex
import sys
import time
from typing import Annotated

import typer
from rich.table import Table

from raystack.cli.common import (
    ClusterOpt,
    JsonOpt,
    NameArg,
    app,
    cluster_name,
    err,
    out,
    print_json,
)
from raystack.client import Cluster
from raystack.client.cluster import up_again
from raystack.client.pending import expected_start
from raystack.client.status import grown_lines
from raystack.errors import ConfigError
from raystack.spec.values import duration_text


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
            by_state = ((s, ", ".join(j)) for s, j in handle.states_of(ids).items())
            err.print(
                "  " + "; ".join(f"{WITH.get(s, 'ended before it')} ({s}): {j}" for s, j in by_state),
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
