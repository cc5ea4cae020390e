"""The `raystack` command: one thin function per verb over the Python API.

Exit codes are a contract: 0 success, 1 a raystack error (one line on stderr naming the fix) or
a cluster that is missing/not ready (`status`), 2 bad usage (typer's own).
"""

from __future__ import annotations

import json
import shlex
import socket
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from raystack import __version__, allocation
from raystack.cluster import Cluster
from raystack.errors import RaystackError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="A persistent, authenticated Ray cluster and a job queue on SLURM.",
)
# Without a terminal rich assumes 80 columns; tables of paths and URLs need more.
_WIDTH = None if sys.stdout.isatty() else 200
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)

NameArg = Annotated[str | None, typer.Argument(help="Cluster name; may be omitted when there is one.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _version(value: bool) -> None:
    if value:
        print(f"raystack {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    pass


@app.command()
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-N", help="Number of nodes.")] = 1,
    profile: Annotated[str, typer.Option("--profile", "-p", help="Cluster profile.")] = "generic",
    name: Annotated[str, typer.Option("--name", help="Cluster name.")] = "default",
    time: Annotated[str | None, typer.Option("--time", "-t", help="Walltime (SLURM format).")] = None,
    partition: Annotated[str | None, typer.Option("--partition")] = None,
    account: Annotated[str | None, typer.Option("--account")] = None,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node")] = None,
    sbatch: Annotated[
        list[str] | None,
        typer.Option("--sbatch", help="Extra sbatch option, e.g. --sbatch=--exclusive (repeatable)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the sbatch argv and script only.")
    ] = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once submitted.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Give up waiting after this many seconds.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit one allocation that runs a Ray cluster, and wait until it is READY."""
    plan = allocation.plan(
        nodes,
        profile=profile,
        name=name,
        time=time,
        partition=partition,
        account=account,
        gpus_per_node=gpus_per_node,
        extra_sbatch=sbatch,
    )
    if dry_run:
        if as_json:
            _print_json({"argv": plan.sbatch_argv(), "script": allocation.render_script(plan)})
        else:
            print("# sbatch argv:\n" + shlex.join(plan.sbatch_argv()))
            print(f"# script ({plan.script_path}):\n" + allocation.render_script(plan), end="")
        return
    cluster = Cluster.submit(plan)
    record = cluster.record()
    if not as_json:
        err.print(f"submitted SLURM job {record.slurm_job_id} for cluster {name}")
    if not no_wait:
        say = (lambda _m: None) if as_json else (lambda m: err.print(f"  {m}"))
        cluster.wait_ready(progress=say, timeout=timeout)
    _show_ready(cluster, as_json)


def _show_ready(cluster: Cluster, as_json: bool) -> None:
    record = cluster.record()
    if as_json:
        _print_json(record.model_dump(mode="json"))
        return
    if record.state.value != "READY":
        out.print(f"cluster {cluster.name}: {record.state.value} ({record.message})")
        out.print(f"follow it with: raystack status {cluster.name}")
        return
    port = record.ports.get("dashboard")
    out.print(
        f"cluster {cluster.name} READY: SLURM job {record.slurm_job_id}, "
        f"{record.nodes_expected} nodes ({', '.join(record.nodes)}), "
        f"{record.gpus_per_node * record.nodes_expected} GPUs"
    )
    out.print(f"dashboard: {record.dashboard_url}")
    out.print(f"tunnel:    ssh -N -L {port}:{record.head_ip}:{port} {socket.gethostname()}")
    out.print(f'env:       eval "$(raystack env {cluster.name})"')


@app.command()
def env(name: NameArg = None, as_json: JsonOpt = False) -> None:
    """Print the exports with which plain `ray job submit` and `ray status` reach the cluster."""
    values = Cluster.get(name).env()
    if as_json:
        _print_json(values)
    else:
        for key, value in values.items():
            print(f"export {key}={shlex.quote(value)}")


@app.command()
def status(name: NameArg = None, as_json: JsonOpt = False) -> None:
    """SLURM state and time left, Ray nodes alive/expected, GPUs and CPUs. Exit 1 unless ready."""
    st = Cluster.get(name).status()
    if as_json:
        _print_json(st.to_dict())
    else:
        left = (
            "-" if st.time_left_s is None else f"{st.time_left_s // 3600}h{st.time_left_s % 3600 // 60:02d}m"
        )
        table = Table(show_header=False, box=None)
        rows = [
            ("cluster", st.name),
            ("state", f"{st.state}  {st.message}"),
            (
                "slurm",
                f"job {st.slurm_job_id} {st.slurm_state or '?'}"
                + (f" ({st.slurm_reason})" if st.slurm_state == "PENDING" else ""),
            ),
            ("time left", left),
            (
                "nodes",
                f"{'-' if st.nodes_alive is None else st.nodes_alive}/{st.nodes_expected} alive",
            ),
            ("GPUs", f"{st.gpus if st.gpus is not None else '-'}"),
            ("CPUs", f"{st.cpus if st.cpus is not None else '-'}"),
            ("dashboard", st.dashboard_url or "-"),
        ]
        if st.ray_error:
            rows.append(("ray", st.ray_error))
        for key, value in rows:
            table.add_row(key, str(value))
        out.print(table)
    if not st.ready:
        raise typer.Exit(1)


@app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """Every known cluster and its state."""
    records = Cluster.list()
    if as_json:
        _print_json([r.model_dump(mode="json") for r in records])
        return
    table = Table("name", "state", "slurm job", "nodes", "GPUs/node", "dashboard", "message")
    for r in records:
        table.add_row(
            r.name,
            r.state.value,
            r.slurm_job_id or "-",
            str(r.nodes_expected),
            str(r.gpus_per_node),
            r.dashboard_url or "-",
            r.message,
        )
    out.print(table)


@app.command()
def down(name: NameArg = None, as_json: JsonOpt = False) -> None:
    """Cancel the allocation, wait until its nodes are released, and mark the cluster STOPPED."""
    record = Cluster.get(name).down()
    if as_json:
        _print_json(record.model_dump(mode="json"))
    else:
        out.print(f"cluster {record.name}: {record.state.value} ({record.message})")


def main() -> None:
    try:
        app()
    except RaystackError as exc:
        err.print(f"raystack: error: {exc}", markup=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
