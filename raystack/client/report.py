"""`raystack report`: how well an allocation was used, from the cluster folder alone (so it works
after `down`): the node programs' usage samples (usage/), the allocations in the record and the
jobs' ledgers.

Times: an allocation is *held* from its start to its end; *startup* until READY; *busy* while a
job runs (from its submission to Ray to its end: the union of every raystack job's runs, plus
the times the head saw other Ray jobs or drivers); *idle* is the rest of the READY time. So
held = startup + busy + idle, and node-hours are those times the allocation's nodes.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raystack.errors import ClusterError
from raystack.store import files, paths
from raystack.store.cluster import ClusterRecord
from raystack.store.ledger import JobRecord, JobState
from raystack.store.usage import read_samples

Span = tuple[float, float]
OPENS = {JobState.SUBMITTED.value, JobState.RUNNING.value}
CLOSES = {
    JobState.QUEUED.value,
    JobState.INTERRUPTED.value,
    *(s.value for s in JobState if s.is_terminal()),
}


# ---------------------------------------------------------------------------- intervals
def merge(spans: Iterable[Span]) -> list[Span]:
    """The union of intervals, as sorted disjoint intervals."""
    merged: list[list[float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def clip(spans: Iterable[Span], window: Span) -> list[Span]:
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo)]


def length(spans: Iterable[Span]) -> float:
    return sum(b - a for a, b in spans)


def inside(t: float, spans: list[Span]) -> bool:
    """t lies in one of `spans` (sorted and disjoint, as `merge` returns them): O(log n)."""
    i = bisect.bisect_right(spans, (t, math.inf)) - 1
    return i >= 0 and spans[i][0] <= t <= spans[i][1]


def job_runs(job: JobRecord, now: float) -> list[Span]:
    """When a job held the cluster: from each submission to Ray to the end of that run."""
    runs: list[Span] = []
    opened: float | None = None
    for entry in sorted(job.history, key=lambda h: h["time"]):
        state, at = entry.get("state"), float(entry["time"])
        if state in OPENS and opened is None:
            opened = at
        elif state in CLOSES and opened is not None:
            runs.append((opened, at))
            opened = None
    if opened is not None:
        runs.append((opened, job.ended or now))
    return runs


# ---------------------------------------------------------------------------- inputs
def allocations(record: ClusterRecord, now: float) -> list[dict[str, Any]]:
    """The record's allocations with a start, an end (now while live) and their samples."""
    found = []
    p = paths.cluster(record.name)
    for entry in record.allocations:
        if not entry.started:
            continue
        alloc_id = entry.alloc_id
        samples = {
            f.name.removeprefix(f"{alloc_id}-").removesuffix(".jsonl"): read_samples(f)
            for f in sorted(p.usage.glob(f"{alloc_id}-*.jsonl"))
        }
        last = max((s[-1]["t"] for s in samples.values() if s), default=None)
        live = record.allocation_id == alloc_id and not record.state.is_terminal() and not entry.ended
        end = now if live else entry.ended or last or entry.started
        if not live and last is not None and end > last + 60:
            end = last  # recorded late (found ended by a later command): the samples know better
        found.append(
            {
                "alloc_id": alloc_id,
                "nodes": int(entry.nodes or record.nodes_expected or 1),
                "started": float(entry.started),
                "ready": float(entry.ready) if entry.ready else None,
                "ended": float(end),
                "live": live,
                "reason": entry.reason,
                "samples": samples,
            }
        )
    return found


def other_ray_jobs(samples: list[dict[str, Any]]) -> list[Span]:
    """Spans in which the head saw Ray jobs that are not raystack's (plain `ray job submit`,
    attached drivers): each such sample covers the time since the previous one."""
    spans = []
    for before, sample in itertools.pairwise(samples):
        if sample.get("other_jobs"):
            spans.append((float(before["t"]), float(sample["t"])))
    return spans


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 1) if values else None


def _gpu_utils(sample: dict[str, Any]) -> list[float]:
    return [float(g[0]) for g in sample.get("gpus") or []]


# ---------------------------------------------------------------------------- the report
def summarize(
    record: ClusterRecord, jobs: list[JobRecord], job_id: str | None = None, now: float | None = None
) -> dict[str, Any]:
    """The report's figures (see the module's docstring), for the whole allocation or one job."""
    now = now or time.time()
    allocs = allocations(record, now)
    if not allocs:
        raise ClusterError(f"cluster {record.name} has no allocation that started: nothing to report")
    runs = {j.id: job_runs(j, now) for j in jobs}
    if job_id is not None:
        if job_id not in runs:
            known = ", ".join(sorted(runs)[:10]) or "none"
            raise ClusterError(f"--job: no job '{job_id}' in cluster {record.name} (known: {known})")
        if not runs[job_id]:
            raise ClusterError(f"--job: job {job_id} never ran (state {_job(jobs, job_id).state.value})")
    t, busy_spans, others, per_alloc = _time_use(allocs, runs)
    held = t["held"]
    focus = merge(runs[job_id]) if job_id else busy_spans
    samples = [(host, s) for a in allocs for host, series in a["samples"].items() for s in series]
    in_focus = [s for _h, s in samples if inside(s["t"], focus)]
    idle_samples = [s for _h, s in samples if not inside(s["t"], busy_spans)]
    by_host: dict[str, list[dict[str, Any]]] = {}
    for h, sample in samples:
        by_host.setdefault(h, []).append(sample)
    series = {h: (ss := sorted(v, key=lambda x: x["t"]), [x["t"] for x in ss]) for h, v in by_host.items()}
    report: dict[str, Any] = {
        "cluster": record.name,
        "job": job_id,
        "allocations": per_alloc,
        "nodes": max(a["nodes"] for a in allocs),
        "held_s": round(held, 1),
        "startup_s": round(t["startup"], 1),
        "busy_s": round(t["busy"], 1),
        "idle_s": round(t["idle"], 1),
        "busy_fraction": round(t["busy"] / held, 3) if held else None,
        "node_hours": round(t["node_h"], 3),
        "busy_node_hours": round(t["busy_node_h"], 3),
        "idle_node_hours": round(t["idle_node_h"], 3),
        "gpu_util_busy": _mean([u for s in in_focus for u in _gpu_utils(s)]),
        "gpu_util_idle": _mean([u for s in idle_samples for u in _gpu_utils(s)]),
        "cpu_busy": _mean([float(s["cpu"]) for s in in_focus if "cpu" in s]),
        "cores_busy": _cores(series, focus),
        "samples": len(samples),
        "per_node": [_node_figures(h, by_host[h], focus) for h in sorted(by_host)],
        "jobs": [_job_figures(j, runs[j.id], series) for j in jobs if runs[j.id]],
        "other_ray_jobs": [[round(a, 2), round(b, 2)] for a, b in others],  # plain Ray jobs, drivers
    }
    if job_id:
        report["job_s"] = round(length(focus), 1)
    return report


Series = dict[str, tuple[list[dict[str, Any]], list[float]]]  # host -> (samples by time, times)


def _time_use(
    allocs: list[dict[str, Any]], runs: dict[str, list[Span]]
) -> tuple[dict[str, float], list[Span], list[Span], list[dict[str, Any]]]:
    """Held, startup, busy and idle seconds and node-hours over the allocations (in all), the busy
    spans, the spans of Ray jobs not raystack's, and each allocation's own figures."""
    t = dict.fromkeys(("held", "startup", "busy", "idle", "node_h", "busy_node_h", "idle_node_h"), 0.0)
    busy_spans: list[Span] = []
    others: list[Span] = []
    per_alloc = []
    for a in allocs:
        ready = a["ready"] or a["ended"]  # never READY: all of it was startup
        head: list[dict[str, Any]] = next(
            (ss for ss in a["samples"].values() if ss and "other_jobs" in ss[-1]), []
        )
        other = merge(clip(other_ray_jobs(head), (ready, a["ended"])))
        others += other
        busy = merge(clip([s for r in runs.values() for s in r], (ready, a["ended"])) + other)
        a_held, a_busy = a["ended"] - a["started"], length(busy)
        a_startup = max(0.0, min(ready, a["ended"]) - a["started"])
        t["held"], t["startup"], t["busy"] = t["held"] + a_held, t["startup"] + a_startup, t["busy"] + a_busy
        t["idle"] += a_held - a_startup - a_busy
        t["idle_node_h"] += (a_held - a_startup - a_busy) * a["nodes"] / 3600
        t["node_h"] += a_held * a["nodes"] / 3600
        t["busy_node_h"] += a_busy * a["nodes"] / 3600
        busy_spans += busy
        keep = ("alloc_id", "nodes", "started", "ready", "ended", "live", "reason")
        per_alloc.append({**{k: a[k] for k in keep}, "held_s": round(a_held, 1)})
    return t, merge(busy_spans), others, per_alloc


def pick(series: Series, spans: list[Span]) -> list[tuple[str, dict[str, Any]]]:
    """The samples of every host within `spans` (sorted, disjoint): bisect, not a scan."""
    found = []
    for host, (samples, times) in series.items():
        for a, b in spans:
            lo, hi = bisect.bisect_left(times, a), bisect.bisect_right(times, b)
            found += [(host, s) for s in samples[lo:hi]]
    return found


def _cores(series: Series, focus: list[Span]) -> float | None:
    """Cores the cluster's processes used while `focus`: each node's mean, summed over nodes."""
    per_host: dict[str, list[float]] = {}
    for host, s in pick(series, focus):
        if "ours" in s:
            per_host.setdefault(host, []).append(float(s["ours"]))
    return round(sum(statistics.fmean(v) for v in per_host.values()), 2) if per_host else None


def _job(jobs: list[JobRecord], job_id: str) -> JobRecord:
    return next(j for j in jobs if j.id == job_id)


def _node_figures(host: str, series: list[dict[str, Any]], focus: list[Span]) -> dict[str, Any]:
    busy = [s for s in series if inside(s["t"], focus)]
    return {
        "host": host,
        "samples": len(series),
        "gpu_util_busy": _mean([u for s in busy for u in _gpu_utils(s)]),
        "gpu_mem_peak_mib": max((sum(g[1] for g in s.get("gpus") or []) for s in series), default=None)
        if any(s.get("gpus") for s in series)
        else None,
        "cpu_busy": _mean([float(s["cpu"]) for s in busy if "cpu" in s]),
        "cores_busy": _mean([float(s["ours"]) for s in busy if "ours" in s]),
        "mem_peak": max((int(s.get("mem", 0)) for s in series), default=None),
    }


def _job_figures(job: JobRecord, runs: list[Span], series: Series) -> dict[str, Any]:
    runs = merge(runs)
    during = [s for _h, s in pick(series, runs)]
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "start": runs[0][0],
        "end": runs[-1][1],
        "run_s": round(length(runs), 1),
        "gpu_util": _mean([u for s in during for u in _gpu_utils(s)]),
        "cores": _cores(series, runs),
    }


# ---------------------------------------------------------------------------- the picture
POINTS = 1500  # per line: a day of 10 s samples is averaged into bins of about a minute


def _thin(pts: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """At most about POINTS points, each the mean of a bin of consecutive samples."""
    k = max(1, math.ceil(len(pts) / POINTS))
    xs, ys = [], []
    for i in range(0, len(pts), k):
        chunk = pts[i : i + k]
        xs.append(statistics.fmean(p[0] for p in chunk))
        ys.append(statistics.fmean(p[1] for p in chunk))
    return xs, ys


def default_png(cluster: str, job: str | None = None) -> Path:
    """Where `raystack report` draws unless told: the user's cache, not the cluster folder (a
    reader only reads it)."""
    return paths.cache() / "reports" / f"{cluster}{'-' + job if job else ''}.png"


def plot(report: dict[str, Any], record: ClusterRecord, out: Path, now: float | None = None) -> Path:
    """A PNG: GPU utilisation and memory per node over time (CPU and host memory where there
    are no GPUs), jobs shaded and named, allocation boundaries dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    allocs = allocations(record, now or time.time())
    series: dict[str, list[dict[str, Any]]] = {}
    for a in allocs:
        for host, samples in a["samples"].items():
            series.setdefault(host, []).extend(samples)
    gpus = any(s.get("gpus") for ss in series.values() for s in ss)
    t0, window = _window(report, allocs)
    unit, scale = ("h", 3600.0) if window[1] - window[0] > 3 * 3600 else ("min", 60.0)
    panels = _panels(gpus)
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.2 * len(panels) + 1), sharex=True, squeeze=False)
    view = _View(t0, scale, window, many=len(series) > 8)
    for ax, (title, value) in zip(axes[:, 0], panels, strict=True):
        _draw_panel(ax, title, value, series, view)
        _mark_jobs(ax, report, allocs, view, first=ax is axes[0, 0])
    top = axes[0, 0]
    for j in report["jobs"]:
        if window[0] <= j["start"] <= window[1]:
            top.annotate(
                j["id"],
                (view.x(j["start"]), 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                rotation=20,
                va="bottom",
            )
    if not view.many and series:
        top.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel(f"{unit} since the allocation started")
    fig.suptitle(_title(report, gpus), fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    part = out.with_name(f".{out.name}.part")
    try:  # (whole or not at all: a full disk leaves no empty PNG behind)
        with open(part, "wb", opener=files.private) as fh:
            fig.savefig(fh, dpi=110, format="png")
        os.replace(part, out)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return out


@dataclass(frozen=True)
class _View:
    """The plot's time axis: its origin, unit (seconds per tick) and the window shown."""

    t0: float
    scale: float
    window: Span
    many: bool  # too many nodes for a legend

    def x(self, t: float) -> float:
        return (t - self.t0) / self.scale

    def shows(self, t: float) -> bool:
        return self.window[0] <= t <= self.window[1]


def _window(report: dict[str, Any], allocs: list[dict[str, Any]]) -> tuple[float, Span]:
    """The plot's origin and window: the allocations, or one job with a margin."""
    t0 = min(a["started"] for a in allocs)
    window = (t0, max(a["ended"] for a in allocs))
    if report["job"]:
        job = next(j for j in report["jobs"] if j["id"] == report["job"])
        margin = max(30.0, 0.1 * (job["end"] - job["start"]))
        window = (max(t0, job["start"] - margin), job["end"] + margin)
    return t0, window


def _panels(gpus: bool) -> list[tuple[str, Any]]:
    panels: list[tuple[str, Any]] = []
    if gpus:
        panels += [
            ("GPU utilisation %", lambda s: statistics.fmean(_gpu_utils(s)) if s.get("gpus") else None),
            ("GPU memory GiB", lambda s: sum(g[1] for g in s.get("gpus") or []) / 1024),
        ]
    return [
        *panels,
        ("CPU % (node)", lambda s: s.get("cpu")),
        ("cores used by the cluster", lambda s: s.get("ours")),
        ("memory GiB (node)", lambda s: (s.get("mem") or 0) / 2**30),
    ]


def _draw_panel(
    ax: Any, title: str, value: Any, series: dict[str, list[dict[str, Any]]], view: _View
) -> None:
    """One figure per node over time."""
    for host, samples in sorted(series.items()):
        pts = [(view.x(s["t"]), value(s)) for s in samples if view.shows(s["t"])]
        pts = [(a, b) for a, b in pts if b is not None]
        if pts:
            xs, ys = _thin(pts)
            ax.plot(xs, ys, lw=0.8 if view.many else 1.2, label=None if view.many else host)
    ax.set_ylabel(title, fontsize=8)
    ax.set_ylim(bottom=0, top=105 if "%" in title else None)
    ax.grid(alpha=0.3)


def _mark_jobs(
    ax: Any, report: dict[str, Any], allocs: list[dict[str, Any]], view: _View, first: bool
) -> None:
    """Jobs shaded, other Ray jobs hatched, allocation boundaries dashed."""
    for i, j in enumerate(report["jobs"]):
        if j["end"] < view.window[0] or j["start"] > view.window[1]:
            continue
        ax.axvspan(view.x(j["start"]), view.x(j["end"]), color=f"C{i % 10}", alpha=0.12, lw=0)
    for k, (a, b) in enumerate(report["other_ray_jobs"]):
        label = "other Ray jobs" if k == 0 and first and not view.many else None
        ax.axvspan(view.x(a), view.x(b), color="grey", alpha=0.12, lw=0, hatch="//", label=label)
    for a in allocs:
        for t in (a["started"], a["ended"]):
            if view.shows(t):
                ax.axvline(view.x(t), color="grey", ls="--", lw=0.8)


def _title(report: dict[str, Any], gpus: bool) -> str:
    if report["job"]:
        util = report["gpu_util_busy"] if gpus else report["cpu_busy"]
        return (
            f"job {report['job']} on cluster {report['cluster']}: ran {report['job_s'] / 60:.1f} min, "
            f"mean {'GPU' if gpus else 'CPU'} utilisation {util or 0:.0f}%"
        )
    return (
        f"cluster {report['cluster']}: {report['node_hours']:.2f} node-hours held, busy "
        f"{100 * (report['busy_fraction'] or 0):.0f}%, idle {report['idle_s'] / 60:.1f} min"
    )
