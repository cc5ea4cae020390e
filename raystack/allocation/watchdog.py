"""The queue runner's watchdog over the attempt in flight: stuck jobs end, with the reason, and
the queue goes on.

- Infeasible: a demand of the job (an actor, a task, a placement group; or the driver's own
  entrypoint resources) that cannot fit any node as the cluster is, for `infeasible_grace`
  seconds (spec, else the profile's, default 60 s): `infeasible: actor Big wants {GPU: 5}; the
  largest node has {GPU: 4, CPU: 16}`. Ray would let it wait forever, and every job behind it.
- Hung: no progress for `hang_timeout` seconds (spec, else the profile's; off by default): no
  new output, and no process of the job moved on any node (allocation/progress.py: its running
  threads' stacks unchanged across the nodes' py-spy samples, no process started or ended).
  Busy is not progress: a rank spinning in an NCCL collective whose peer never comes uses its
  GPU and a CPU core fully. The nodes' usage samples carry what they saw (allocation/usage.py);
  where a node cannot look at stacks (no py-spy) the CPU use of the job's processes stands in;
  without samples (a full filesystem) nothing is judged hung. `hung: no progress for 30m ...`,
  with what the stacks and the flight recorders show once the nodes dumped them (the runner).
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
from raystack.store import cluster as records
from raystack.store import diagnosis, paths, stacks
from raystack.store import progress as watched
from raystack.store.ledger import JobRecord, read_job, update_job
from raystack.waiting import REAL, Clock

log = logging.getLogger("raystack.runner")
INFEASIBLE_EVERY = 5.0  # seconds between looks at a running job's pending demands
HANG_EVERY = 10.0  # seconds between looks at a job's output and usage
SPY_EVERY = (1.0, 30.0)  # the nodes sample a watched job's stacks every hang_timeout/6 within these
CPU_ACTIVE = 0.05  # cores: a job whose busiest process used less over a sample did nothing
GPU_ACTIVE = 5.0  # % utilisation of any GPU of the allocation that counts as activity
DEFAULT_GRACE = float(os.environ.get("RAYSTACK_INFEASIBLE_GRACE") or 60)
DEFAULT_HANG = float(os.environ.get("RAYSTACK_HANG_TIMEOUT") or 0) or None
TAIL_BYTES = 16 << 10  # read from the end of each node's usage file
STACK_WAIT = 40.0  # seconds a hung job waits for the nodes' stack and flight recorder dumps


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
    moved: dict[str, float] = field(default_factory=dict)  # host -> (wall) its last report of a move
    spied: dict[str, int] = field(default_factory=dict)  # host -> stack samples it reported


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
        self.spying: dict[str, float] | None = None  # the jobs the nodes sample (store/progress.py)
        self.stacks_asked: dict[str, tuple[float, float, set[str]]] = {}  # sid -> (asked, deadline, hosts)

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
        self.ask_nodes()

    def ask_nodes(self) -> None:
        """Tell the nodes which running jobs to sample (written only when the set changes)."""
        wanted = {
            w.job_id: min(max(w.hang / 6, SPY_EVERY[0]), SPY_EVERY[1])
            for w in self.watches.values()
            if w.hang and w.hang_checked > -1e18
        }
        if wanted != self.spying:
            try:
                watched.watch(self.cluster, wanted)
                self.spying = wanted
            except OSError as exc:  # (a full filesystem: the CPU rule stands in meanwhile)
                log.warning("cannot ask the nodes to sample stacks: %s", exc)

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
            first = w.hang_checked <= -1e18
            w.hang_checked = now
            if first:
                self.ask_nodes()
            if self.hung(record, w, now):
                return f"hung: no progress for {duration_text(w.hang)} (no output, no stack moved)"
        return None

    def fault(self, record: JobRecord, sid: str, fault: str) -> JobRecord:
        """Say in the ledger at once why the attempt must stop; a hung job's stacks and flight
        recorders are asked for from every node first (the runner stops it once stacks_pending
        is False)."""
        log.warning("%s %s", record.id, fault)
        if fault.startswith("hung"):
            fault = f"{fault}; stacks in {stacks.folder(self.cluster, record.id)}"
            asked = stacks.request(self.cluster, record.id)
            entries = records.read_node_entries(self.cluster)
            hosts = {h for h, e in entries.items() if e.get("alloc_id") == self.allocation}
            self.stacks_asked[sid] = (asked, self.clock.now() + STACK_WAIT, hosts)
            return update_job(
                self.cluster, record.id, fault=fault, message=f"{fault} (dumping stacks, then stopping it)"
            )
        return update_job(self.cluster, record.id, fault=fault, message=f"{fault} (stopping it)")

    def stacks_pending(self, sid: str, job_id: str) -> bool:
        """A hung job's dumps are still awaited (until every node answered, or STACK_WAIT); once
        they are in, the job's fault says what they show (store/diagnosis.py)."""
        if sid not in self.stacks_asked:
            return False
        asked, deadline, hosts = self.stacks_asked[sid]
        if self.clock.now() < deadline and hosts - set(stacks.answered(self.cluster, job_id, asked)):
            return True
        del self.stacks_asked[sid]
        folder = paths.cluster(self.cluster).job_files(job_id)
        try:
            found = diagnosis.diagnose(folder, since=asked)
        except OSError as exc:
            log.warning("%s: stacks not read: %s", job_id, exc)
            found = ""
        if found:
            record = read_job(self.cluster, job_id)
            head, _, where = (record.fault or "").partition("; stacks in ")
            fault = f"{head}: {found}; stacks in {where}"[:1000]
            update_job(self.cluster, job_id, fault=fault, message=f"{fault} (stopping it)")
        return False

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
        """No new output and no process moving in any usage sample since the last sign of
        progress, over `hang` seconds (at least two samples: without samples nothing is hung)."""
        size = self.log_size(record)
        if size != w.log_size:
            w.log_size, w.active, w.quiet_samples = size, now, 0
        for sample in self.samples_since(w.sample_t):
            w.sample_t = max(w.sample_t, float(sample.get("t", 0)))
            moved = progress_in(sample, record.id, w)
            if moved:
                w.active, w.quiet_samples = now, 0
            elif moved is not None:
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


def progress_in(sample: dict[str, Any], job_id: str, w: Watch) -> bool | None:
    """What one node's usage sample says of the job: True (a process of it moved since that node's
    last report), False (a new stack sample in which none did), None (nothing new). A node that
    cannot sample stacks (no py-spy; no row yet) says what its CPU and GPU use say, as before."""
    row = (sample.get("progress") or {}).get(job_id)
    if not isinstance(row, dict) or row.get("error"):
        return sample_active(sample, job_id)
    host = str(row.get("host"))
    moved, spied = float(row.get("moved") or 0), int(row.get("n") or 0)
    if moved > w.moved.get(host, 0.0):
        w.moved[host], w.spied[host] = moved, spied
        return True
    if spied > w.spied.get(host, 0):
        w.spied[host] = spied
        return False
    return None


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
