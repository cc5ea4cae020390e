"""The `raystack` command: one thin function per verb over the Python API.

Exit codes are a contract: 0 success, 1 a raystack error (one line on stderr naming the fix) or
a cluster that is missing/not ready (`status`), 2 bad usage (typer's own).
"""

from __future__ import annotations

import json
import shlex
import socket
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from raystack import __version__
from raystack.allocation import sbatch as allocation
from raystack.client import Cluster, Job
from raystack.errors import RaystackError
from raystack.store import queue
from raystack.store.ledger import JobRecord, JobState

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
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", "-c", help="Cluster name (default: the only one).")
]
JobArg = Annotated[str, typer.Argument(help="Job id, as printed by `raystack submit`.")]
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
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", help="Default: every GPU of the node (sinfo).")
    ] = None,
    cpus_per_task: Annotated[
        int | None, typer.Option("--cpus-per-task", help="Default: every CPU of the node (sinfo).")
    ] = None,
    sbatch: Annotated[
        list[str] | None,
        typer.Option("--sbatch", help="Extra sbatch option, e.g. --sbatch=--exclusive (repeatable)."),
    ] = None,
    chain: Annotated[
        int | None,
        typer.Option(
            "--chain", help="Allocations in all: the cluster and its queue live across K walltimes."
        ),
    ] = None,
    signal_lead: Annotated[
        str | None,
        typer.Option("--signal-lead", help="Warn this long before each walltime end (default 10m)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the sbatch argv and script only.")
    ] = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once submitted.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Give up waiting after this many seconds.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit one allocation that runs a Ray cluster, and wait until it is READY."""
    plan = Cluster.plan(
        nodes,
        profile=profile,
        name=name,
        time=time,
        partition=partition,
        account=account,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        extra_sbatch=sbatch,
        chain=chain,
        signal_lead=signal_lead,
    )
    if plan.note and not as_json:
        err.print(f"raystack: {plan.note}", markup=False)
    if dry_run:
        if as_json:
            _print_json({"argv": plan.sbatch_argv(), "script": allocation.render_script(plan)})
        else:
            print("# sbatch argv:\n" + shlex.join(plan.sbatch_argv()))
            print(f"# script ({plan.script_path}):\n" + allocation.render_script(plan), end="")
        return
    cluster = Cluster.submit_plan(plan)
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
def wait(
    name: NameArg = None,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait until a cluster (e.g. one started with --no-wait) is READY; exit 1 if it ends first."""
    cluster = Cluster.get(name)
    say = (lambda _m: None) if as_json else (lambda m: err.print(f"  {m}"))
    cluster.wait_ready(progress=say, timeout=timeout)
    _show_ready(cluster, as_json)


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
            ("jobs", f"running {st.running_job or '-'}, {st.queued_jobs} queued"),
        ]
        if st.chain_count > 1:
            nxt = (
                f"; next: job {st.next_job_id} {st.next_state or '?'}"
                + (f" ({st.next_reason})" if st.next_reason and st.next_reason != "None" else "")
                if st.next_job_id
                else ""
            )
            rows.insert(4, ("chain", f"allocation {st.chain_index} of {st.chain_count}{nxt}"))
        if st.resuming_jobs:
            rows.append(("resumes", ", ".join(st.resuming_jobs)))
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


# ---------------------------------------------------------------------------- jobs
def _exit_for(record: JobRecord) -> None:
    """`--follow` and `logs -f` exit with the job's outcome: 0 only when it SUCCEEDED."""
    if record.state is not JobState.SUCCEEDED:
        err.print(f"job {record.id} {record.state.value}: {record.message}", markup=False)
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    args: Annotated[list[str], typer.Argument(help="A job spec (.yaml), or a command after --.")],
    cluster: ClusterOpt = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="Override a spec field: key.sub=value.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream the log; exit with the job's outcome.")
    ] = False,
    now: Annotated[
        bool, typer.Option("--now", help="Skip the queue: submit as soon as the cluster is READY.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Queue a job (spec file or `-- command`) on the cluster; it may still be PENDING in SLURM."""
    target = Cluster.get(cluster)
    is_spec = len(args) == 1 and args[0].endswith((".yaml", ".yml"))
    job = target.submit(args[0] if is_spec else list(args), sets=sets or [], now=now)
    record, pos = job.record(), job.position()
    if as_json:
        _print_json({"id": job.id, "cluster": job.cluster, "state": record.state.value, "position": pos})
    else:
        where = "next" if pos == 1 else f"position {pos}" if pos else "submitting now"
        err.print(f"queued job {job.id} on cluster {job.cluster} ({where})", markup=False)
        if not follow:
            err.print(f"  follow it: raystack logs {job.id} -f    stop it: raystack stop {job.id}")
    if follow:
        _exit_for(job.follow())


@app.command("queue")
def queue_(
    name: NameArg = None,
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Every job of the ledger, not only the recent ones.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The cluster's jobs: running, the next queued and the last finished (--all: every job)."""
    cluster = Cluster.get(name)
    view = queue.view(cluster.name, every=show_all)
    rows = [_job_row(cluster.name, r, view.positions) for r in view.records]
    if as_json:
        _print_json(rows)
        return
    table = Table("id", "name", "state", "pos", "start", "duration", "message")
    for r, row in zip(view.records, rows, strict=True):
        start = time.strftime("%H:%M:%S", time.localtime(r.started)) if r.started else "-"
        dur = f"{row['duration_s']:.1f}s" if row["duration_s"] is not None else "-"
        table.add_row(r.id, r.name, r.state.value, str(row["position"] or "-"), start, dur, r.message[:60])
    out.print(table)
    if view.more_queued or view.more_finished:
        err.print(
            f"  ... and {view.more_queued} more queued, {view.more_finished} more finished: "
            f"raystack queue {cluster.name} --all"
        )


def _job_row(cluster: str, r: JobRecord, places: dict[str, int]) -> dict[str, Any]:
    end = r.ended or (time.time() if r.started else None)
    return {
        "id": r.id,
        "name": r.name,
        "state": r.state.value,
        "cluster": cluster,
        "position": places.get(r.id, 0),
        "queued": r.request.queued_at,
        "start": r.started,
        "end": r.ended,
        "duration_s": round(end - r.started, 3) if r.started and end else None,
        "attempts": len(r.attempts),
        "allocations": [a.allocation for a in r.attempts],
        "exit_code": r.exit_code,
        "message": r.message,
    }


@app.command()
def logs(
    job_id: JobArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")] = False,
    cluster: ClusterOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="The job's state and whole log as JSON.")] = False,
) -> None:
    """Print a job's log (kept in the cluster folder, readable after `down`)."""
    job = Job.get(job_id, cluster)
    if follow:
        _exit_for(job.follow(out=sys.stderr if as_json else None))
    if as_json:
        _print_json({**_job_row(job.cluster, job.record(), {job.id: job.position()}), "log": job.logs()})
    elif not follow:
        print(job.logs(), end="")


@app.command()
def stop(job_id: JobArg, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """Stop a running job: SIGTERM, then kill after its stop_grace (STOPPED). A queued job is cancelled."""
    record = Job.get(job_id, cluster).stop()
    _print_job(record, as_json)


@app.command()
def cancel(job_id: JobArg, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """Remove a job that has not started from the queue (CANCELLED)."""
    record = Job.get(job_id, cluster).cancel()
    _print_job(record, as_json)


def _print_job(record: JobRecord, as_json: bool) -> None:
    if as_json:
        _print_json(record.model_dump(mode="json"))
    else:
        out.print(f"job {record.id}: {record.state.value} ({record.message})", markup=False)


def main() -> None:
    try:
        app()
    except RaystackError as exc:
        err.print(f"raystack: error: {exc}", markup=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
