"""The queue runner's watchdog over the attempt in flight: stuck jobs end, with the reason, and
the queue goes on.

- Infeasible: a demand of the job (an actor, a task, a placement group; or the driver's own
  entrypoint resources) that cannot fit any node as the cluster is, for `infeasible_grace`
  seconds (spec, else the profile's, default 60 s): `infeasible: actor Big wants {GPU: 5}; the
  largest node has {GPU: 4, CPU: 16}`. Ray would let it wait forever, and every job behind it.
- Hung: no progress for `hang_timeout` seconds (spec, else the profile's; off by default): no
  new output, and the job moved on no node (allocation/watchdog/progress.py says what moving is: a
  variable of a thread that ran, a stack, a file, a process, a native kernel, a GPU's memory).
  Busy is not progress: a rank spinning in an NCCL collective whose peer never comes uses its
  GPU and a CPU core fully. The nodes' usage samples carry what they saw (allocation/node/usage.py);
  where a node cannot look at stacks (no py-spy) the CPU use of the job's processes stands in;
  without samples (a full filesystem) nothing is judged hung. At the verdict the hang is
  suspected: every node dumps the job's stacks and flight recorders, and the job's message says
  `suspected hang since 03:12 (stacks: ...)`. Then `hang_action: stop` (the default) stops it,
  FAILED `hung: no progress for 30m ...` with what the dumps show, unless it moved meanwhile;
  `warn` lets it run, and a job that moves again is cleared.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raystack.adapters import ray as rayapi
from raystack.durations import duration_text
from raystack.errors import RaystackError
from raystack.launch import pool
from raystack.plan.feasible import Demand, fmt, why_infeasible
from raystack.store import diagnosis, node_entries, paths, stacks
from raystack.store import progress as watched
from raystack.store.ledger import JobRecord, read_job, update_job
from raystack.waiting import REAL, Clock, Repeats

log = logging.getLogger("raystack.runner")
INFEASIBLE_EVERY = 5.0  # seconds between looks at a running job's pending demands
HANG_EVERY = 10.0  # seconds between looks at a job's output and usage
SPY_EVERY = (1.0, 30.0)  # the nodes sample a watched job's stacks every hang_timeout/6 within these
CPU_ACTIVE = 0.05  # cores: a job whose busiest process used less over a sample did nothing
GPU_ACTIVE = 5.0  # % utilisation of any GPU of the allocation that counts as activity
DEFAULT_GRACE = float(os.environ.get("RAYSTACK_INFEASIBLE_GRACE") or 60)
DEFAULT_HANG = float(os.environ.get("RAYSTACK_HANG_TIMEOUT") or 0) or None
DEFAULT_ACTION = os.environ.get("RAYSTACK_HANG_ACTION") or "stop"
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
    action: str = "stop"  # hang_action: "stop" or "warn"
    suspected: float | None = None  # (clock) when a hang was suspected (None: not suspected)
    deaf_until: float = -1e18  # (clock) output before this is no progress: the dumps' own lines
    evidence: str = ""  # what the last move was, and where ("values on node2")
    waiting: bool = False  # it waits for the cluster (a demand not placed yet): not hung meanwhile


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
        action: str = DEFAULT_ACTION,
    ):
        self.cluster, self.api, self.allocation, self.gcs = cluster, api, allocation, gcs_address
        self.clock, self.grace, self.hang, self.action = clock, grace, hang, action
        self.log_size = log_size or self._log_size
        self.watches: dict[str, Watch] = {}
        self.spying: dict[str, float] | None = None  # the jobs the nodes sample (store/progress.py)
        self.stacks_asked: dict[str, tuple[float, float, set[str]]] = {}  # sid -> (asked, deadline, hosts)
        self.asking = Repeats(clock.now, log, "asking the nodes to sample stacks")

    def watch(self, record: JobRecord) -> Watch:
        sid = record.attempts[-1].id
        if sid not in self.watches:
            req = record.request
            grace = req.infeasible_grace if req.infeasible_grace is not None else self.grace
            hang = (req.hang_timeout or None) if req.hang_timeout is not None else self.hang
            now = self.clock.now()
            action = req.hang_action or self.action
            self.watches[sid] = Watch(sid, record.id, grace, hang, now, active=now, action=action)
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
                self.asking.over()
            except OSError as exc:  # (a full filesystem: asked again next pass, said once a minute)
                self.asking.failed(str(exc))

    def check(self, record: JobRecord, info: Any, running: bool) -> str | None:
        """A fault text when the attempt in flight must be stopped (infeasible, hung), else None."""
        w = self.watch(record)
        now = self.clock.now()
        if (w.grace or (w.hang and running)) and now - w.checked >= INFEASIBLE_EVERY:  # (both 0: off)
            w.checked = now
            try:
                found = self.infeasible_now(record, info, running, w)
            except RaystackError as exc:  # (a busy State API: judge next time)
                log.debug("demands of %s not read: %s", w.sid, exc)
                found = None
            if found is not None and w.grace:
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
            stuck = self.hung(record, w, now)
            if w.suspected is not None and not stuck:
                self.cleared(record, w)
            elif stuck and w.suspected is None:
                return f"hung: no progress for {duration_text(w.hang)} (no output, no stack moved)"
            elif w.suspected is not None and w.sid in self.stacks_asked:
                self.stacks_pending(w.sid, record.id)  # (warn: the dumps' summary, once they are in)
        return None

    def cleared(self, record: JobRecord, w: Watch) -> None:
        """A suspected hang that moved again: the suspicion is lifted (and a stop not yet sent is off)."""
        since = record.suspected or time.time()
        w.suspected = None
        self.stacks_asked.pop(w.sid, None)
        message = f"running as {w.sid} (moved again at {clock_text(time.time())}"
        message += f" by {w.evidence}" if w.evidence else ""
        message += f", after a suspected hang since {clock_text(since)})"
        log.info("%s %s", record.id, message)
        update_job(self.cluster, record.id, suspected=None, fault=None, message=message)

    def fault(self, record: JobRecord, sid: str, fault: str) -> JobRecord:
        """Say in the ledger at once why the attempt must stop. A hang is suspected first: the
        stacks and flight recorders of every node are asked for, and with `hang_action: stop` the
        runner stops the job once they are in (stacks_pending is False); with `warn` it runs on."""
        log.warning("%s %s", record.id, fault)
        if not fault.startswith("hung"):
            return update_job(self.cluster, record.id, fault=fault, message=f"{fault} (stopping it)")
        w = self.watch(record)
        folder = stacks.folder(self.cluster, record.id)
        now = self.clock.now()
        since = time.time() - (now - w.active)
        asked = stacks.request(self.cluster, record.id)
        entries = node_entries.read_node_entries(self.cluster)
        hosts = {h for h, e in entries.items() if e.get("alloc_id") == self.allocation}
        self.stacks_asked[sid] = (asked, now + STACK_WAIT, hosts)
        w.suspected, w.deaf_until = now, now + STACK_WAIT
        suspected = f"suspected hang since {clock_text(since)} (stacks: {folder})"
        if w.action == "warn":
            message = f"{suspected}; it runs on (hang_action: warn)"
            return update_job(self.cluster, record.id, suspected=since, message=message)
        fault = f"{fault}; stacks in {folder}"
        message = f"{suspected}: {fault} (dumping stacks, then stopping it)"
        return update_job(self.cluster, record.id, suspected=since, fault=fault, message=message)

    def stacks_pending(self, sid: str, job_id: str) -> bool:
        """A suspected hang's dumps are still awaited (until every node answered, or STACK_WAIT);
        True too when the job moved meanwhile (its suspicion and stop are lifted: the next pass
        reads it running). Once the dumps are in, the job's fault (stop) or message (warn) says
        what they show (store/diagnosis.py)."""
        if sid not in self.stacks_asked:
            return False
        w = self.watches.get(sid)
        record = read_job(self.cluster, job_id)
        if w is not None and record.fault and not self.hung(record, w, self.clock.now()):
            self.cleared(record, w)
            return True
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
        if found and record.fault:
            head, _, kept_in = record.fault.partition("; stacks in ")
            fault = f"{head}: {found}; stacks in {kept_in}"[:1000]
            update_job(self.cluster, job_id, fault=fault, message=f"{fault} (stopping it)")
        elif found:
            update_job(self.cluster, job_id, message=f"{record.message}: {found}"[:1000])
        return False

    # ------------------------------------------------------------------ infeasible
    def infeasible_now(
        self, record: JobRecord, info: Any, running: bool, w: Watch | None = None
    ) -> dict[str, str] | None:
        """Every demand of the job that cannot fit now, by a key; None when it cannot be told.
        Whether it waits for the cluster (an actor or a placement group not placed yet, or an
        actor's worker starting) is noted in `w.waiting`: a job that waits is not hung."""
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
        # (an SPMD job's group may be the launch host's, made at the submit: launch/ahead.py)
        raw = self.api.pending_demands(ray_job_id, groups=(pool.PREFIX + w.sid,) if w else ())
        if w is not None:  # (tasks waiting for a CPU are a task farm's normal state: not counted)
            w.waiting = any(d["kind"] != "task" for d in raw)
        raw = [d for d in raw if d["bundles"]]  # (an actor of a placed group: its worker starting)
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
        if w.waiting:  # (its actors or tasks wait for resources or a worker: not its own hang)
            w.active, w.quiet_samples, w.evidence = now, 0, "waiting for the cluster"
        size = self.log_size(record)
        if size != w.log_size:
            if now >= w.deaf_until:  # (not the lines a rank's flight-recorder dump may print)
                w.active, w.quiet_samples, w.evidence = now, 0, "output"
            w.log_size = size
        for sample in self.samples_since(w.sample_t):
            w.sample_t = max(w.sample_t, float(sample.get("t", 0)))
            moved = progress_in(sample, record.id, w)
            if moved:
                w.active, w.quiet_samples = now, 0
                row = (sample.get("progress") or {}).get(record.id) or {}
                w.evidence = f"{row.get('why') or 'cpu'} on {row.get('host') or sample.get('host', '?')}"
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


def clock_text(t: float) -> str:
    """A wall-clock time as the user's messages show it: 03:12."""
    return time.strftime("%H:%M", time.localtime(t))


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
