"""Verbs about jobs: submit, queue, logs, stop, cancel."""

from __future__ import annotations

import difflib
import sys
import time
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from raystack.cli.common import (
    ClusterOpt,
    JobArg,
    JsonOpt,
    NameArg,
    app,
    cluster_name,
    err,
    on_interrupt,
    out,
    print_json,
)
from raystack.cli.submit import exit_for, what_goes_on
from raystack.client import Cluster, Job, JobRecord, JobState
from raystack.client.job import Sweep, stale_note
from raystack.client.status import runner_failing, runner_waiting
from raystack.errors import ClusterError, ConfigError
from raystack.spec.values import parse_duration


@app.command("queue", short_help="The cluster's jobs: running, queued, finished.")
def queue_(
    name: NameArg = None,
    cluster: ClusterOpt = None,
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Every job of the ledger, not only the recent ones.")
    ] = False,
    states: Annotated[
        list[str] | None,
        typer.Option("--state", "-s", metavar="STATE", help="Only jobs in this state (repeatable, or a,b)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The cluster's jobs: running, the next queued and the last finished (--all: every job)."""
    wanted = _states(states)
    handle = Cluster.get(cluster_name(name, cluster))
    view = handle.queue(every=show_all or bool(wanted))
    records = [r for r in view.records if not wanted or r.state in wanted]
    rows = [_job_row(handle.name, r, view.positions) for r in records]
    if as_json:
        print_json(rows)
        return
    table = Table("id", "name", "state", "pos", "start", "duration", "message")
    for r, row in zip(records, rows, strict=True):
        start = time.strftime("%H:%M:%S", time.localtime(r.started)) if r.started else "-"
        dur = f"{row['duration_s']:.1f}s" if row["duration_s"] is not None else "-"
        name = r.name + (
            f" [{' '.join(f'{k}={v}' for k, v in r.request.sweep_values.items())}]" if r.request.sweep else ""
        )
        table.add_row(r.id, name, r.state.value, str(row["position"] or "-"), start, dur, r.message[:160])
    out.print(table)
    for sweep in dict.fromkeys(r.request.sweep for r in records if r.request.sweep):
        counts = view.sweeps.get(sweep, {})
        err.print(
            f"  sweep {sweep}: {', '.join(f'{n} {s.lower()}' for s, n in counts.items())}", markup=False
        )
    if view.set_aside:
        ids = ", ".join(view.set_aside)
        folder = next(iter(view.set_aside.values())).parent
        err.print(
            f"  set aside: {ids}: the ledger could not be read (now in {folder}; not run or followed)",
            markup=False,
        )
    record = handle.snapshot()
    if stuck := runner_failing(handle.name, record) or runner_waiting(handle.name, record):
        err.print(f"  {stuck}", markup=False)
    if any(not r.state.is_terminal() for r in view.records) and (note := stale_note(handle.name)):
        err.print(f"raystack: note: {note}", markup=False)
    if not wanted and view.hidden():
        err.print(f"  ... and {view.hidden()}: raystack queue {handle.name} --all")


def _states(given: list[str] | None) -> set[JobState]:
    """--state values (any case, comma-separated or repeated), each a JobState."""
    names = [w.strip().upper() for g in given or [] for w in g.split(",") if w.strip()]
    known = [s.value for s in JobState]
    for n in names:
        if n not in known:
            close = difflib.get_close_matches(n, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"--state: no job state {n!r}; {hint}states: {', '.join(known)}")
    return {JobState(n) for n in names}


@app.command("job", short_help="One job's state, times and message.")
def job_(job_id: JobArg, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """One job's state, where it waits, its times, attempts and last message (as `ray job status`)."""
    job = Job.get(job_id, cluster)
    record = job.record()
    row = _job_row(job.cluster, record, {job.id: job.position()})
    waiting = job.waiting_line(record)
    note = None if record.state.is_terminal() else stale_note(job.cluster)
    if as_json:
        print_json({**row, "waiting": waiting, "prepared": record.prepared, "note": note})
        return
    when = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"  # noqa: E731
    table = Table(show_header=False, box=None)
    for key, value in (
        ("job", f"{record.id} ({record.name}) on cluster {job.cluster}"),
        ("state", record.state.value + (f": {waiting}" if waiting else "")),
        ("queued", when(record.request.queued_at)),
        ("started", when(record.started)),
        ("ended", when(record.ended)),
        ("duration", f"{row['duration_s']:.1f}s" if row["duration_s"] is not None else "-"),
        ("attempts", ", ".join(f"{a.id} (allocation {a.allocation})" for a in record.attempts) or "-"),
        ("exit code", "-" if record.exit_code is None else str(record.exit_code)),
        ("message", record.message or "-"),
        *([("environment", f"prepared: {record.prepared}")] if record.prepared else []),
        ("log", f"raystack logs {record.id}"),
    ):
        table.add_row(key, value)
    out.print(table)
    if note:
        err.print(f"raystack: note: {note}", markup=False)


def _job_row(cluster: str, r: JobRecord, places: dict[str, int]) -> dict[str, Any]:
    end = _ran_until(r)
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
        "sweep": r.request.sweep,
        "sweep_values": r.request.sweep_values,
        "after": r.request.after,
    }


def _ran_until(r: JobRecord) -> float | None:
    """When its run ended (now, for a running job): an INTERRUPTED job stopped running when it was
    interrupted, and its duration stays what it ran until it starts again."""
    if r.ended or not r.started:
        return r.ended
    if r.state is JobState.INTERRUPTED:
        return next((h["time"] for h in reversed(r.history) if h["state"] == r.state.value), r.started)
    return time.time()


@app.command(short_help="A job's log (-f: follow; --all: its workers' errors).")
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
    lines: Annotated[
        int, typer.Option("--lines", "-n", min=1, help="Lines shown per worker with --all.")
    ] = 40,
    tail: Annotated[
        int | None, typer.Option("--tail", metavar="N", min=0, help="Only the last N lines of the job's log.")
    ] = None,
) -> None:
    """Print a job's log (kept in the cluster folder, readable after `down`); --all adds its
    actors' worker logs from Ray's own logs (those with an error; --node/--actor: every match).
    A job still in the queue says where it stands: `queued, position 3 (running: grpo-7b, 40m in)`."""
    job = Job.get(job_id, cluster)
    if follow:
        with on_interrupt(lambda: what_goes_on([job])):
            exit_for(job.follow(out=sys.stderr if as_json else None))
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
        text = job.logs()
        if tail is not None:
            text = "".join(text.splitlines(keepends=True)[-tail:] if tail else [])
        print(text, end="")
        record = job.record()
        if waiting := job.waiting_line(record):
            err.print(f"raystack: job {job.id} {waiting}", markup=False)
        elif not record.state.is_terminal() and (note := job.room_note()):
            err.print(f"raystack: note: {note}", markup=False)
    if found is None:
        return
    _print_workers(job, found, shown, lines)


def _print_workers(job: Job, found: list[Any], shown: list[Any], lines: int) -> None:
    for w in shown:
        print(f"\n==> {w.label} (attempt {w.attempt}){': ' + w.error if w.error else ''} <==")
        print(job.worker_tail(w, lines), end="")
    folder = job.workers_folder
    errors = sum(1 for w in found if w.error)
    nodes = len({w.host for w in found})
    err.print(
        f"raystack: {len(found)} worker(s) of job {job.id} on {nodes} node(s), {errors} with an error; "
        f"their logs: {folder}",
        markup=False,
    )


@app.command(short_help="Dump the Python stacks of a running job on every node.")
def stacks(
    job_id: JobArg,
    cluster: ClusterOpt = None,
    timeout: Annotated[
        str, typer.Option(metavar="TIME", help="How long to wait for every node's answer.")
    ] = "30s",
    as_json: JsonOpt = False,
) -> None:
    """Dump the Python stacks of every process of a running job on every node (py-spy), and its
    ranks' flight recorders; the job goes on. The dumps are kept in logs/jobs/<id>/stacks/ (and
    flight/); the last line says which ranks wait in which collective and which never arrived.
    Of an ended job: the dumps taken before it was stopped (a hung job's)."""
    try:
        wait_s = parse_duration(timeout)
    except ValueError as exc:
        raise ConfigError(f"--timeout: {exc}") from None
    dumps = Job.get(job_id, cluster).stacks(timeout=wait_s)
    if as_json:
        found = {"folder": str(dumps.folder), "files": [str(f) for f in dumps.files], "late": dumps.late}
        print_json({**found, "summary": dumps.summary, "kept": dumps.kept})
        return
    for path in dumps.files:
        print(f"==> {path.name} <==")
        print(path.read_text(errors="replace"), end="")
    late = f"; no answer from {', '.join(dumps.late)}" if dumps.late else ""
    taken = " (kept from before it was stopped)" if dumps.kept else ""
    err.print(
        f"raystack: {len(dumps.files)} process(es) of job {job_id} on {len(dumps.answered)} node(s)"
        f"{late}; in {dumps.folder}{taken}",
        markup=False,
    )
    if dumps.summary:
        err.print(f"raystack: {dumps.summary}", markup=False)
    if not dumps.files:
        raise typer.Exit(1)


@app.command(short_help="Cancel a job, as scancel does: a queued one leaves the queue, a running one stops.")
def cancel(job_id: JobArg, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a job as scancel does: one not started leaves the queue (CANCELLED), a running one is
    stopped (SIGTERM, then kill after its stop_grace: STOPPED). A sweep's id cancels all of it."""
    target = _job_or_sweep(job_id, cluster)
    if isinstance(target, Sweep):
        sweep = target
        ended = sweep.stop()
        if as_json:
            print_json([r.model_dump(mode="json") for r in ended])
            return
        cancelled = sum(1 for r in ended if r.state is JobState.CANCELLED)
        gone = len(sweep.job_ids) - len(ended)
        out.print(
            f"sweep {sweep.id}: {cancelled} job(s) cancelled"
            + (f", {len(ended) - cancelled} stopped" if len(ended) > cancelled else "")
            + (f", {gone} had ended" if gone else ""),
            markup=False,
        )
        for record in ended:
            _print_job(record, as_json)
        return
    record = target.record()
    if record.state.is_terminal():
        raise ClusterError(f"job {record.id} has ended ({record.state.value}): nothing to cancel")
    _print_job(target.stop(), as_json)


@app.command(short_help="The same as cancel (a queued job leaves the queue, a running one stops).")
def stop(job_id: JobArg, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """The same as `raystack cancel`: a job not started leaves the queue, a running one is stopped
    (SIGTERM, then kill after its stop_grace); a sweep's id stops all of it."""
    cancel(job_id, cluster, as_json)


def _job_or_sweep(job_id: str, cluster: str | None) -> Job | Sweep:
    """The job of this id, else the sweep of this id (stop and cancel take both)."""
    try:
        return Job.get(job_id, cluster)
    except ClusterError:
        sweep = Sweep.get(job_id, cluster)
        if sweep is None:
            raise
        return sweep


def _print_job(record: JobRecord, as_json: bool) -> None:
    if as_json:
        print_json(record.model_dump(mode="json"))
    else:
        out.print(f"job {record.id}: {record.state.value} ({record.message})", markup=False)
