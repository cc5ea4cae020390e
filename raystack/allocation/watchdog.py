"""The queue runner's watchdog over the attempt in flight: stuck jobs end, with the reason, and
the queue goes on.

- Infeasible: a demand of the job (an actor, a task, a placement group; or the driver's own
  entrypoint resources) that cannot fit any node as the cluster is, for `infeasible_grace`
  seconds (spec, else the profile's, default 60 s): `infeasible: actor Big wants {GPU: 5}; the
  largest node has {GPU: 4, CPU: 16}`. Ray would let it wait forever, and every job behind it.
- Hung: no new output and no CPU or GPU use by the job's processes for `hang_timeout` seconds
  (spec, else the profile's; off by default): `hung: no output or activity for 30m`. The usage
  samples of the node programs say what each job's processes used (allocation/usage.py);
  without samples (a full filesystem) nothing is judged hung.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raystack.adapters import ray as rayapi
from raystack.errors import RaystackError
from raystack.plan.feasible import Demand, fmt, why_infeasible
from raystack.slurmtime import duration_text
from raystack.store import paths
from raystack.store.ledger import JobRecord
from raystack.waiting import REAL, Clock

log = logging.getLogger("raystack.runner")
INFEASIBLE_EVERY = 5.0  # seconds between looks at a running job's pending demands
HANG_EVERY = 10.0  # seconds between looks at a job's output and usage
CPU_ACTIVE = 0.05  # cores: a job whose busiest process used less over a sample did nothing
GPU_ACTIVE = 5.0  # % utilisation of any GPU of the allocation that counts as activity
DEFAULT_GRACE = float(os.environ.get("RAYSTACK_INFEASIBLE_GRACE") or 60)
DEFAULT_HANG = float(os.environ.get("RAYSTACK_HANG_TIMEOUT") or 0) or None
TAIL_BYTES = 16 << 10  # read from the end of each node's usage file


@dataclass
class Watch:
    """What the watchdog knows of one attempt."""

    sid: str
    job_id: str
    grace: float
    hang: float | None
    seen: float  # (clock) when it was first seen in flight
    infeasible: dict[str, tuple[float, str]] = field(default_factory=dict)  # key -> (since, why)
    checked: float = -1e18
    hang_checked: float = -1e18
    active: float = 0.0  # (clock) last sign of activity
    log_size: int = -1
    sample_t: float = 0.0  # (wall) the newest usage sample read
    quiet_samples: int = 0  # samples since `active` that showed no activity


class Watchdog:
    """`check(record, info)` on every runner pass; returns a fault text when the job must stop."""

    def __init__(
        self,
        cluster: str,
        api: Any,
        allocation: str | None,
        gcs_address: str | None,
        clock: Clock = REAL,
        grace: float = DEFAULT_GRACE,
        hang: float | None = DEFAULT_HANG,
        log_size: Callable[[JobRecord], int] | None = None,
    ):
        self.cluster, self.api, self.allocation, self.gcs = cluster, api, allocation, gcs_address
        self.clock, self.grace, self.hang = clock, grace, hang
        self.log_size = log_size or self._log_size
        self.watches: dict[str, Watch] = {}

    def watch(self, record: JobRecord) -> Watch:
        sid = record.attempts[-1].id
        if sid not in self.watches:
            req = record.request
            grace = req.infeasible_grace if req.infeasible_grace is not None else self.grace
            hang = (req.hang_timeout or None) if req.hang_timeout is not None else self.hang
            now = self.clock.now()
            self.watches[sid] = Watch(sid, record.id, grace, hang, now, active=now)
        return self.watches[sid]

    def forget(self, sid: str) -> None:
        self.watches.pop(sid, None)

    def check(self, record: JobRecord, info: Any, running: bool) -> str | None:
        """A fault text when the attempt in flight must be stopped (infeasible, hung), else None."""
        w = self.watch(record)
        now = self.clock.now()
        if w.grace and now - w.checked >= INFEASIBLE_EVERY:  # (grace 0: off)
            w.checked = now
            try:
                found = self.infeasible_now(record, info, running)
            except RaystackError as exc:  # (a busy State API: judge next time)
                log.debug("demands of %s not read: %s", w.sid, exc)
                found = None
            if found is not None:
                for key in [k for k in w.infeasible if k not in found]:
                    del w.infeasible[key]
                for key, why in found.items():
                    w.infeasible.setdefault(key, (now, why))
        for since, why in w.infeasible.values():
            if now - since >= w.grace:
                return f"infeasible: {why}"
        if running and w.hang and now - w.hang_checked >= min(HANG_EVERY, w.hang / 3):
            w.hang_checked = now
            if self.hung(record, w, now):
                return f"hung: no output or activity for {duration_text(w.hang)}"
        return None

    # ------------------------------------------------------------------ infeasible
    def infeasible_now(self, record: JobRecord, info: Any, running: bool) -> dict[str, str] | None:
        """Every demand of the job that cannot fit now, by a key; None when it cannot be told."""
        nodes = [dict(n.resources) for n in self.api.alive_nodes()]
        found: dict[str, str] = {}
        if not running:
            req = record.request
            driver = {
                "CPU": req.entrypoint_num_cpus,
                "GPU": req.entrypoint_num_gpus,
                "memory": float(req.entrypoint_memory),  # (bytes, as Ray's memory resource)
                **req.entrypoint_resources,
            }
            why = why_infeasible(Demand("driver", "(entrypoint)", [driver]), nodes)
            if why:
                found["driver"] = why.replace("driver (entrypoint) wants", "the driver wants", 1)
            return found
        ray_job_id = getattr(info, "job_id", None)
        if not ray_job_id:
            return found
        raw = self.api.pending_demands(ray_job_id)
        strategies: dict[str, str] = {}
        if any(d["kind"] == "placement group" for d in raw) and self.gcs:
            try:
                strategies = rayapi.pg_strategies(self.gcs)
            except RaystackError:
                strategies = {}
        for d in raw:
            demand = Demand(
                d["kind"],
                d["name"],
                [dict(b) for b in d["bundles"]],
                strategies.get(d.get("pg_id") or "", ""),
                bool(d.get("ray_infeasible")),
            )
            why = why_infeasible(demand, nodes)
            if why:
                found[f"{demand.kind}:{demand.name}:{fmt(demand.bundles[0]) if demand.bundles else ''}"] = why
        return found

    # ------------------------------------------------------------------ hangs
    def hung(self, record: JobRecord, w: Watch, now: float) -> bool:
        """No new output and no busy process or GPU in every usage sample since the last sign of
        activity, over `hang` seconds (at least two samples: without samples nothing is hung)."""
        size = self.log_size(record)
        if size != w.log_size:
            w.log_size, w.active, w.quiet_samples = size, now, 0
        for sample in self.samples_since(w.sample_t):
            w.sample_t = max(w.sample_t, float(sample.get("t", 0)))
            if sample_active(sample, record.id):
                w.active, w.quiet_samples = now, 0
            else:
                w.quiet_samples += 1
        return now - w.active >= (w.hang or float("inf")) and w.quiet_samples >= 2

    def samples_since(self, t: float) -> list[dict[str, Any]]:
        """This allocation's usage samples (every node's) newer than `t` (wall clock)."""
        folder = paths.cluster(self.cluster).usage
        prefix = f"{self.allocation}-"
        found = []
        try:
            names = [e.name for e in os.scandir(folder) if e.name.startswith(prefix)]
        except OSError:
            return []
        for name in names:
            for line in _tail_lines(folder / name, TAIL_BYTES):
                try:
                    sample = json.loads(line)
                except ValueError:
                    continue
                if isinstance(sample, dict) and float(sample.get("t", 0)) > t:
                    found.append(sample)
        return sorted(found, key=lambda s: float(s.get("t", 0)))

    def _log_size(self, record: JobRecord) -> int:
        p = paths.cluster(self.cluster)
        log_path = p.job_log(record.id, len(record.attempts))
        total = 0
        for part in (
            log_path,
            log_path.with_name(log_path.name + ".tail"),
            log_path.with_name(log_path.name + ".tail.1"),
        ):
            try:
                total += part.stat().st_size
            except OSError:
                continue
        return total


def sample_active(sample: dict[str, Any], job_id: str) -> bool:
    """Whether one node's usage sample shows the job doing something: its busiest process used
    CPU_ACTIVE cores or more, or a GPU of the node was busy."""
    row = (sample.get("jobs") or {}).get(job_id)
    if isinstance(row, list) and len(row) >= 2 and float(row[1]) >= CPU_ACTIVE:
        return True
    for gpu in sample.get("gpus") or []:
        if isinstance(gpu, list) and gpu and isinstance(gpu[0], int | float) and gpu[0] >= GPU_ACTIVE:
            return True
    return False


def _tail_lines(path: os.PathLike[str], size: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, end - size))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    return lines[1:] if end > size else lines
