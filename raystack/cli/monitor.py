"""Verbs for watching a cluster: top (live) and report (after the fact, after `down` too)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from raystack.cli.common import ClusterOpt, JsonOpt, NameArg, app, cluster_name, err, out, print_json, shown
from raystack.client import Cluster
from raystack.client import report as reports
from raystack.client.top import snapshot, watch
from raystack.errors import ConfigError
from raystack.spec.values import duration_text

GIB = 2**30


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f}"


def render(view: dict[str, Any]) -> Group:
    """One screen of `raystack top`."""
    left = "-" if view["time_left_s"] is None else duration_text(view["time_left_s"])
    idle = ""
    if view["idle_s"] is not None:
        idle = f"   idle {duration_text(view['idle_s'])}"
        if view["idle_timeout_s"]:
            idle += f" (autostop at {duration_text(view['idle_timeout_s'])})"
    head = Text(
        f"cluster {view['cluster']}  {view['state']}  {view['where']}  "
        f"time left {left}{idle}   {time.strftime('%H:%M:%S', time.localtime(view['time']))}"
    )
    nodes = Table("node", "ip", "CPU %", "Ray cores", "mem GiB", "GPU util %", "GPU mem GiB", box=None)
    for n in view["nodes"]:
        gpus = n["gpus"]
        util = " ".join(f"{g['util']:.0f}" if g["util"] is not None else "?" for g in gpus) or "-"
        mem = " ".join(f"{(g['mem_used_mib'] or 0) / 1024:.1f}" for g in gpus) or "-"
        nodes.add_row(
            f"{n['host']}{' (head)' if n['head'] else ''}",
            str(n["ip"]),
            "-" if n["cpu_percent"] is None else f"{n['cpu_percent']:.0f}",
            "-" if n["ray_cpu"] is None else f"{n['ray_cpu']:.2f}",
            f"{_gib(n['mem_used'])}/{_gib(n['mem_total'])}",
            util,
            mem,
        )
    parts: list[Any] = [head, nodes]
    if view.get("ended"):
        parts.append(Text(f"ended: {shown(view['message'])}"))
    elif view["ray_error"]:
        parts.append(Text(f"ray: {shown(view['ray_error'])}", style="red"))
    elif len(view["nodes"]) < view["nodes_expected"] and view["state"] == "READY":
        parts.append(Text(f"{len(view['nodes'])}/{view['nodes_expected']} nodes alive", style="red"))
    jobs = Table("job", "name", "state", "elapsed", box=None)
    for j in view["running"]:
        elapsed = "-" if j["elapsed_s"] is None else duration_text(j["elapsed_s"])
        jobs.add_row(j["id"], j["name"], j["state"], elapsed)
    for j in view["queue"]:
        jobs.add_row(j["id"], j["name"], j["state"], "")
    more = view["queued"] - len(view["queue"])
    parts.append(Text(f"\njobs: {len(view['running'])} in flight, {view['queued']} queued"))
    if view["running"] or view["queue"]:
        parts.append(jobs)
    if more > 0:
        parts.append(Text(f"... and {more} more queued"))
    return Group(*parts)


@app.command(short_help="Live CPU, memory and GPU use per node.")
def top(
    name: NameArg = None,
    cluster: ClusterOpt = None,
    once: Annotated[bool, typer.Option("--once", help="One snapshot, then exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", "-n", help="Seconds between refreshes.")] = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Live view of a cluster: per node CPU, memory and GPUs (Ray's own node stats), the jobs
    running and queued, the time left and idle time. Ctrl-C ends it. Into a pipe or a file:
    one snapshot, as --once."""
    handle = Cluster.get(cluster_name(name, cluster))
    if as_json and not once:
        raise ConfigError("--json: use it with --once (one snapshot for scripts)")
    if interval < 0.5:
        raise ConfigError(f"--interval: {interval:g}s is too short; use 0.5 or more")
    view = snapshot(handle.name)
    # An ended cluster: its last state once, not a view that never changes. Into a pipe or a file
    # a live view writes nothing until Ctrl-C (and nothing at all when killed): one snapshot.
    if once or view["ended"] or not out.is_terminal:
        if as_json:
            print_json(view)
        else:
            out.print(render(view))
        if view["ray_error"] or not view["nodes"]:
            raise typer.Exit(1)
        return
    try:
        with Live(render(view), console=out, screen=False, auto_refresh=False) as live:
            watch(handle.name, interval, lambda view: live.update(render(view), refresh=True))
    except KeyboardInterrupt:
        return
    raise typer.Exit(1)  # (the cluster ended while watched)


@app.command(short_help="How well an allocation was used (node-hours, GPU use).")
def report(
    name: NameArg = None,
    cluster: ClusterOpt = None,
    job: Annotated[str | None, typer.Option("--job", help="Only this job's run.")] = None,
    png: Annotated[
        Path | None,
        typer.Option(
            "--png",
            help="Where to write the plot (default: ~/.cache/raystack/reports/NAME.png).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """How well the allocation was used: node-hours held, busy and idle time, mean GPU
    utilisation while jobs ran; and a PNG of GPU/CPU use per node with the jobs marked.
    Works after `raystack down` (everything comes from the cluster folder)."""
    handle = Cluster.get(cluster_name(name, cluster))
    record, jobs = handle.record(), handle.jobs()
    figures = reports.summarize(record, jobs, job)
    default = reports.default_png(handle.name, job)
    figures["png"] = None
    try:
        figures["png"] = str(reports.plot(figures, record, png or default))
    except ImportError:  # (the report extra: matplotlib)
        err.print("raystack: no plot: matplotlib is not installed (pip install 'raystack-slurm[report]')")
    except OSError as exc:  # (a full disk, a read-only folder: the figures are whole, the plot is not)
        err.print(
            f"raystack: no plot: could not write {exc.filename or png or default}: {exc.strerror or exc}"
        )
    if as_json:
        print_json(figures)
        return
    _print_report(figures, record.name, record.state.value, job)
    if figures["png"]:
        out.print(f"plot: {figures['png']}", markup=False, soft_wrap=True)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _report_rows(figures: dict[str, Any], name: str, state: str, job: str | None) -> list[tuple[str, str]]:
    """The summary table of `raystack report`, one (key, value) per row."""
    pct = _pct
    rows = [
        ("cluster", f"{name} ({state}), {len(figures['allocations'])} allocation(s)"),
        (
            "held",
            f"{duration_text(figures['held_s'])} x {figures['nodes']} nodes = "
            f"{figures['node_hours']:.2f} node-hours",
        ),
        ("startup", duration_text(figures["startup_s"])),
        (
            "busy",
            f"{duration_text(figures['busy_s'])} ({pct(100 * (figures['busy_fraction'] or 0))}), "
            f"{figures['busy_node_hours']:.2f} node-hours",
        ),
        ("idle", f"{duration_text(figures['idle_s'])}, {figures['idle_node_hours']:.2f} node-hours"),
        ("GPU util", f"{pct(figures['gpu_util_busy'])} while busy, {pct(figures['gpu_util_idle'])} idle"),
        (
            "CPU",
            f"{pct(figures['cpu_busy'])} of the nodes while busy; "
            f"{'-' if figures['cores_busy'] is None else figures['cores_busy']} cores used by the cluster",
        ),
    ]
    if figures["other_ray_jobs"]:
        spans = figures["other_ray_jobs"]
        ran = duration_text(sum(b - a for a, b in spans))
        rows.insert(4, ("other jobs", f"{ran} with Ray jobs not raystack's (ray job submit, drivers)"))
    if job:
        rows.insert(1, ("job", f"{job}: ran {duration_text(figures['job_s'])}"))
    for a in figures["allocations"]:
        end = "running" if a["live"] else a["reason"] or "ended"
        rows.append(
            ("allocation", f"{a['alloc_id']}: {a['nodes']} nodes, {duration_text(a['held_s'])} ({end})")
        )
    return rows


def _print_report(figures: dict[str, Any], name: str, state: str, job: str | None) -> None:
    pct = _pct
    table = Table(show_header=False, box=None)
    for key, value in _report_rows(figures, name, state, job):
        table.add_row(key, value)
    out.print(table)
    jt = Table("job", "name", "state", "ran", "GPU util", "cores")
    for j in figures["jobs"]:
        jt.add_row(
            j["id"],
            j["name"],
            j["state"],
            duration_text(j["run_s"]),
            pct(j["gpu_util"]),
            "-" if j["cores"] is None else f"{j['cores']:.2f}",
        )
    if figures["jobs"]:
        out.print(jt)
