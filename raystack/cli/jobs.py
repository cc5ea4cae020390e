"""Verbs about jobs: submit, queue, logs, stop, cancel."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from raystack.cli.common import ClusterOpt, JobArg, JsonOpt, NameArg, app, err, out, print_json
from raystack.client import Cluster, Job, JobRecord, JobState
from raystack.spec.planning import PlanSpec, describe


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
    record, pos = job.seen or job.record(), job.position()
    if as_json:
        print_json({"id": job.id, "cluster": job.cluster, "state": record.state.value, "position": pos})
    else:
        where = "next" if pos == 1 else f"position {pos}" if pos else "submitting now"
        err.print(f"queued job {job.id} on cluster {job.cluster} ({where})", markup=False)
        if record.request.plan:
            plan = PlanSpec.model_validate(record.request.plan)
            line = describe(plan, target.snapshot(), f"job {job.id}", record.request.processes)
            err.print(f"  plan: {line}", markup=False)
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
    view = cluster.queue(every=show_all)
    rows = [_job_row(cluster.name, r, view.positions) for r in view.records]
    if as_json:
        print_json(rows)
        return
    table = Table("id", "name", "state", "pos", "start", "duration", "message")
    for r, row in zip(view.records, rows, strict=True):
        start = time.strftime("%H:%M:%S", time.localtime(r.started)) if r.started else "-"
        dur = f"{row['duration_s']:.1f}s" if row["duration_s"] is not None else "-"
        table.add_row(r.id, r.name, r.state.value, str(row["position"] or "-"), start, dur, r.message[:160])
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
        "commands": [a.entrypoint for a in r.attempts],  # what Ray ran, per attempt
        "exit_code": r.exit_code,
        "message": r.message,
        "actor_error": r.actor_error,
    }


@app.command()
def logs(
    job_id: JobArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")] = False,
    cluster: ClusterOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="The job's state and whole log as JSON.")] = False,
    workers: Annotated[
        bool,
        typer.Option(
            "--all",
            "-a",
            help="Then, per node and actor, the last lines of every worker that logged an error.",
        ),
    ] = False,
    node: Annotated[
        str | None, typer.Option("--node", help="Only workers on this node (implies --all).")
    ] = None,
    actor: Annotated[
        str | None, typer.Option("--actor", help="Only actors whose name contains this (implies --all).")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines shown per worker with --all.")] = 40,
) -> None:
    """Print a job's log (kept in the cluster folder, readable after `down`); --all adds its
    actors' worker logs from Ray's own logs (those with an error; --node/--actor: every match)."""
    job = Job.get(job_id, cluster)
    if follow:
        _exit_for(job.follow(out=sys.stderr if as_json else None))
    filtered = node is not None or actor is not None
    found = job.workers(node, actor) if workers or filtered else None
    shown = [w for w in found or [] if w.error or filtered]
    if as_json:
        row = {**_job_row(job.cluster, job.record(), {job.id: job.position()}), "log": job.logs()}
        if found is not None:
            row["workers"] = [{**asdict(w), "tail": job.worker_tail(w, lines)} for w in shown]
        print_json(row)
        return
    if not follow:
        print(job.logs(), end="")
    if found is None:
        return
    for w in shown:
        print(f"\n==> {w.label} (attempt {w.attempt}){': ' + w.error if w.error else ''} <==")
        print(job.worker_tail(w, lines), end="")
    folder = job.folder
    errors = sum(1 for w in found if w.error)
    nodes = len({w.host for w in found})
    err.print(
        f"raystack: {len(found)} worker(s) of job {job.id} on {nodes} node(s), {errors} with an error; "
        f"their logs: {folder}",
        markup=False,
    )


@app.command()
def stacks(
    job_id: JobArg,
    cluster: ClusterOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for every node's answer.")] = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Dump the Python stacks of every process of a running job on every node (py-spy); the job
    goes on. The dumps are kept in logs/jobs/<id>/stacks/."""
    dumps = Job.get(job_id, cluster).stacks(timeout=timeout)
    if as_json:
        print_json({"folder": str(dumps.folder), "files": [str(f) for f in dumps.files], "late": dumps.late})
        return
    for path in dumps.files:
        print(f"==> {path.name} <==")
        print(path.read_text(errors="replace"), end="")
    late = f"; no answer from {', '.join(dumps.late)}" if dumps.late else ""
    err.print(
        f"raystack: {len(dumps.files)} process(es) of job {job_id} on {len(dumps.answered)} node(s)"
        f"{late}; in {dumps.folder}"
    )
    if not dumps.files:
        raise typer.Exit(1)


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
        print_json(record.model_dump(mode="json"))
    else:
        out.print(f"job {record.id}: {record.state.value} ({record.message})", markup=False)
