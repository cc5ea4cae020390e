"""The public Python API for clusters; every CLI verb is one call here.

from raystack import Cluster
c = Cluster.up(nodes=4, profile="isambard", name="grpo")   # submits, waits until READY
c.status(); c.env(); c.down()
"""

from __future__ import annotations

import errno
import hashlib
import logging
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import raystack.client.allocate as allocate
import raystack.client.submission as submission
from raystack.adapters.allocator import AllocState, allocator
from raystack.adapters.ray import Dashboard
from raystack.client.access import live_dashboard
from raystack.client.job import Job
from raystack.client.pending import PendingShown, pending_line, unseen_output
from raystack.client.reconcile import PendingEnd, as_ended, job_as_ended, pending_end, settle
from raystack.client.status import HEAD_SILENT, ClusterStatus, status_of
from raystack.errors import ClusterError, ConfigError, NoSuchCluster
from raystack.spec import job as specs
from raystack.spec.job import JobSpec
from raystack.spec.profile import Profile
from raystack.spec.resolve import new_job_id, prepare_jobs
from raystack.store import cluster as records
from raystack.store import deps, files, paths, tls
from raystack.store.cluster import ClusterRecord, ClusterState, EndKind, read_heartbeat
from raystack.store.cluster import up_again as up_again  # (for the CLI: how to start one again)
from raystack.store.ledger import JobRecord, JobRequest, all_jobs, read_job
from raystack.store.paths import ClusterPaths
from raystack.store.queue import QueueView, active, enqueue_all, id_taken, positions
from raystack.store.queue import view as queue_view
from raystack.store.recovery import settle_orphans
from raystack.store.secrets import forget as forget_secrets
from raystack.store.secrets import keep
from raystack.store.secrets import take as take_secrets
from raystack.waiting import REAL, Clock, until

log = logging.getLogger("raystack")

Progress = Callable[[str], None]
ASK_EVERY_MIN, ASK_EVERY_MAX = 2.0, 10.0  # seconds between asking the scheduler while waiting
Strings = list[str]  # (inside Cluster, `list` is the classmethod: ids, GPU ids, --set items)
JobRecords = list[JobRecord]
Jobs = list[Job]


def filesystem_error(exc: OSError) -> str | None:
    """One line for a file operation the filesystem refused (RAYSTACK_HOME missing, not writable,
    full or over quota), naming the path and the fix; None for an OSError about no file."""
    if not exc.filename:
        return None
    what = exc.strerror or type(exc).__name__
    line = f"{exc.filename}: {what}"
    home = paths.home()
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # (the clusters live there: free room, not move)
        return (
            f"{line}: RAYSTACK_HOME's filesystem ({home}) is full or over your quota; free room there "
            "(`raystack forget` removes ended clusters' folders; `quota` or `lfs quota` says yours), "
            "then try again"
        )
    if str(exc.filename).startswith(str(home)) or str(home).startswith(str(exc.filename)):
        line += (
            f" (RAYSTACK_HOME is {home}: set RAYSTACK_HOME to a folder you can write, with room, "
            "on a filesystem every node sees)"
        )
    return line


def keep_secrets(cluster: str, requests: list[JobRequest]) -> list[str]:
    """Each request's secrets, from this environment, into its file (store/secrets.py) before it
    is queued; the nonces written. A name that is not set fails here, before anything is queued."""
    names = list(dict.fromkeys(n for r in requests for n in r.secrets))
    values = take_secrets(names) if names else {}
    kept = []
    for request in requests:
        if request.secrets:
            keep(cluster, request.nonce, {n: values[n] for n in request.secrets})
            kept.append(request.nonce)
    return kept


def after_option(items: list[str] | None) -> list[str]:
    """--after's ids as given (ConfigError naming the one that is no id), for submit and check."""
    for item in items or []:
        if not specs.AFTER.fullmatch(item):
            raise ConfigError(
                f"--after {item!r}: give a job or sweep id, optionally with :ok, :any or :notok"
            )
    return list(items or [])


def tunnel_line(record: ClusterRecord, local_ip: str, port: int, host: str) -> str:
    """The ssh tunnel to a cluster's dashboard from a laptop; a local cluster's head is this
    machine, where none is needed (its dashboard is open here at the cluster's URL)."""
    ssh = f"ssh -N -L {local_ip}:{port}:{record.head_ip}:{port} {host}"
    return (
        f"none on this machine ({record.dashboard_url}); from another: {ssh}"
        if not allocator(record.backend).remote
        else ssh
    )


class Cluster:
    """A handle on one named cluster in $RAYSTACK_HOME."""

    def __init__(self, name: str, record: ClusterRecord | None = None, raw: ClusterRecord | None = None):
        self.name = paths.validate_name(name, "the cluster")
        self.seen = record  # the record as this handle last read it, in SLURM's light
        self.raw = raw  # the record as read from the file (not yet shown to SLURM)
        self.pending: PendingEnd | None = None  # an end SLURM reported that the record lacks

    def __repr__(self) -> str:
        return f"Cluster({self.name!r})"

    # ------------------------------------------------------------------ lookup
    @classmethod
    def get(cls, name: str | None = None) -> Cluster:
        """The named cluster, or the only live one there is (in SLURM's light: one whose allocation
        ended unrecorded is not live), or the only one. Raises ClusterError when missing."""
        record = records.find(name, ended=lambda r: r.state.is_terminal() or pending_end(r) is not None)
        return cls(record.name, raw=record)

    @staticmethod
    def none_here() -> str:
        """What is said where a listing finds no cluster at all."""
        return records.no_clusters()

    @classmethod
    def names(cls) -> list[str]:
        """The clusters' names in RAYSTACK_HOME, from their folders alone (no record read, no SLURM:
        what shell completion offers)."""
        return records.list_names()  # (sorted)

    @classmethod
    def list(cls) -> list[ClusterRecord]:
        """Every cluster's record in SLURM's light. One that cannot be read is named on stderr and
        left out: one bad file (a full disk, a hand edit) must not hide the other clusters."""
        found = []
        for name in records.list_names():
            try:
                found.append(cls(name).record())
            except (records.UnreadableRecord, NoSuchCluster) as exc:  # (NoSuchCluster: forgotten meanwhile)
                log.warning("raystack: warning: %s", exc)
        return found

    def record(self) -> ClusterRecord:
        """The record, read now and seen in SLURM's light (what every view starts from): an
        allocation SLURM says ended shows as ended. Nothing is written: see `settle`."""
        self.raw = self.seen = None
        return self.snapshot()

    def settle(self) -> ClusterRecord:
        """Write down what `record` only shows: the end of an allocation that could not record it
        itself (its head SIGKILLed, a node failure, cancelled while pending), its jobs in flight
        FAILED or requeued. The commands that change a cluster call it; readers never do."""
        self.seen, self.pending = settle(self.raw or records.read(self.name)), None
        self.raw = self.seen
        return self.seen

    def snapshot(self) -> ClusterRecord:
        """The record as this handle last read it (read now if never): one command reads and
        reconciles it once, and passes it along."""
        if self.seen is None:
            raw = self.raw or records.read(self.name)
            self.pending = pending_end(raw)
            self.seen = as_ended(raw, self.pending)
        return self.seen

    @property
    def folder(self) -> Path:
        return paths.cluster(self.name).root

    @property
    def paths(self) -> ClusterPaths:
        """Every path of the cluster folder (logs, ledger, ...)."""
        return paths.cluster(self.name)

    def queue(self, every: bool = False) -> QueueView:
        """What `raystack queue` shows: running, the next queued, the last finished (or every job).
        Jobs in flight in an allocation that ended unrecorded show as they will be settled."""
        self.snapshot()
        found = queue_view(self.name, every=every)
        found.records = [job_as_ended(r, self.pending) for r in found.records]
        return found

    # ------------------------------------------------------------------ up
    @classmethod
    def up(
        cls,
        nodes: int,
        *,
        wait: bool = True,
        progress: Progress | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> Cluster:
        """Submit an allocation (see allocate.plan for options) and, by default, wait for READY."""
        plan = cls.plan(nodes, **options)
        cluster = cls.submit_plan(plan)
        if wait:
            cluster.wait_ready(progress=progress, timeout=timeout)
        return cluster

    @classmethod
    def plan(cls, nodes: int, **options: Any) -> allocate.AllocationPlan:
        """The allocation `up` would submit (nothing is submitted): counts left at "auto" become
        whole nodes of the partition, read from sinfo."""
        return allocate.plan_on_partition(nodes, **options)

    @classmethod
    def submit_plan(cls, plan: allocate.AllocationPlan) -> Cluster:
        """Perform a plan: create the folder and token, write the script, sbatch it."""
        return cls(str(plan.name), submission.submit(plan))

    @staticmethod
    def space_warning(profile: Profile) -> str | None:
        """Why RAYSTACK_HOME's filesystem may run out of room for the cluster folder, or None."""
        return submission.space_warning(profile)

    @classmethod
    def up_local(
        cls,
        *,
        gpus: int | None = None,
        cpus: int | None = None,
        profile: str | Profile = "generic",
        name: str = "local",
        wait: bool = True,
        progress: Progress | None = None,
        timeout: float | None = None,
    ) -> Cluster:
        """A one-node cluster on this machine, without SLURM: the same node program, folder,
        token, queue and ledger. `gpus`/`cpus`: this machine's share (default: all of it)."""
        prof = allocate.local_profile(profile)
        return cls.up(
            1,
            profile=prof,
            name=name,
            gpus_per_node=gpus,
            cpus_per_task=cpus,
            wait=wait,
            progress=progress,
            timeout=timeout,
        )

    def wait_ready(
        self, progress: Progress | None = None, timeout: float | None = None, clock: Clock = REAL
    ) -> ClusterRecord:
        """Poll the record until READY; raise when it ends first.

        SLURM is asked too (has the allocation started? did it end?), rate-limited: every 2 s at
        first, backing off to every 10 s while it stays PENDING and once it runs (the head then
        writes progress into the record itself).
        """
        say = progress or (lambda _msg: None)
        last_asked, interval = -1e9, ASK_EVERY_MIN
        last_line, estimate, unseen = "", PendingShown(), None
        now: list[ClusterRecord] = []

        def step() -> ClusterRecord | None:
            nonlocal last_asked, interval, last_line, unseen
            record = records.read(self.name)
            if record.state is ClusterState.READY:  # (and its allocation still runs)
                record = as_ended(record, pending_end(record))
            if record.state is ClusterState.READY:
                if allocator(record.backend).remote:
                    self.check_locks(record, say)
                self.seen = record
                return record
            if clock.now() - last_asked >= interval:
                last_asked = clock.now()
                interval = min(interval * 1.5, ASK_EVERY_MAX)
                if record.state is ClusterState.STARTING:
                    interval = ASK_EVERY_MAX
                info = allocator(record.backend).info(record.allocation_id) if record.allocation_id else None
                record = as_ended(record, pending_end(record, info))
                if info is not None and info.state is AllocState.WAITING and estimate.moved(info):
                    say(last_line := pending_line(record, info))
                elif (
                    record.state is ClusterState.SUBMITTED
                    and not unseen
                    and (unseen := unseen_output(self.name, info, time.time()))
                ):
                    say(f"warning: {unseen}")
            if record.state.is_terminal():
                logs = str(paths.cluster(self.name).logs)
                hint = "" if logs in record.message else f" (logs: {logs})"
                raise ClusterError(f"cluster {self.name} {record.state.value}: {record.message}{hint}")
            if record.state is ClusterState.STARTING:
                line = f"STARTING: {record.nodes_joined}/{record.nodes_expected} nodes joined"
                if line != last_line:
                    say(last_line := line)
            now[:] = [record]
            return None

        def late() -> ClusterError:
            return ClusterError(
                f"cluster {self.name} not READY after {timeout:.0f}s "
                f"({now[0].state.value}: {now[0].message}); it is still queued or "
                f"starting: `raystack status {self.name}` or `raystack down {self.name}`"
            )

        return until(step, 0.25, clock, timeout, late)

    def check_locks(self, record: ClusterRecord, say: Progress) -> bool:
        """Whether this host sees the lock the head's node program holds on .lockprobe. Where it
        does not (mount options `localflock`, NFS `nolock`: each host has its own locks), a
        `cancel` here and the runner's `start` on the head could both win: the cluster folder then
        uses link locks, which need only link(2) to be atomic. True when locks are shared."""
        p = paths.cluster(self.name)
        beat = read_heartbeat(self.name)
        alive = beat is not None and time.time() - float(beat.get("t", 0)) < HEAD_SILENT
        seen = files.lock_seen(p, record.allocation_id) if alive else None
        if seen is False and not files.uses_link_locks(p):
            files.use_link_locks(p, f"flock taken on the head is not seen from {socket.gethostname()}")
            say(
                f"warning: {paths.home()} does not share flock locks between this host and the head "
                "(mount option localflock or nolock?): this cluster uses link locks instead"
            )
        return seen is not False

    # ------------------------------------------------------------------ inspect
    def status(self) -> ClusterStatus:
        """The record, SLURM's and Ray's view joined (client/status.py)."""
        return status_of(self.name, self.record())

    def dashboard(self) -> Dashboard:
        """An authenticated client of this cluster's dashboard (Jobs and State APIs), once SLURM
        confirms its allocation runs (client/access.py)."""
        return live_dashboard(self.record())

    def tunnel(self, login_host: str | None = None) -> dict[str, str]:
        """How to open the dashboard from a laptop: an ssh tunnel on a loopback address of this
        cluster's own (127.0.0.x from its name), so two clusters' login cookies (scoped to the
        host) never mix, and how to get the token it asks for."""
        record = self.snapshot()
        port = record.ports.get("dashboard")
        if not record.head_ip or not port:
            raise ClusterError(f"cluster {self.name} has no dashboard yet ({record.state.value})")
        local_ip = loopback_for(self.name)
        host = login_host or socket.gethostname()
        info = {
            "url": f"{'https' if record.tls else 'http'}://{local_ip}:{port}",
            "tunnel": tunnel_line(record, local_ip, port, host),
            "login": f'eval "$(raystack env {self.name})" && ray get-auth-token',
        }
        if not allocator(record.backend).remote and record.dashboard_url:  # (open here as it is; the tunnel's
            info["tunnel_url"], info["url"] = info["url"], record.dashboard_url  # from elsewhere)
        if record.tls:  # the certificate names the head's address, not the tunnel's
            info["certificate"] = (
                f"signed by the cluster's own CA {tls.ca_cert(self.name)}: import it, or accept "
                "the browser's warning for this address"
            )
        return info

    def env(self) -> dict[str, str]:
        """Variables with which plain `ray job submit`, `ray job logs` and `ray status` work."""
        record = self.record()
        if not record.gcs_address or not record.dashboard_url:
            raise ClusterError(
                f"cluster {self.name} has no Ray address yet ({record.state.value}): "
                f"wait for it with `raystack wait {self.name}`, or see `raystack status {self.name}`"
            )
        env = {
            "RAY_ADDRESS": record.gcs_address,  # ray status, ray.init()
            "RAY_API_SERVER_ADDRESS": record.dashboard_url,  # ray job submit/logs/list
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(paths.cluster(self.name).token),
            "RAYSTACK_CLUSTER": self.name,
        }
        if record.tls:  # the client certificate; `ray job ... --verify "$RAY_TLS_CA_CERT"`
            env.update(tls.ray_env(tls.client(self.name), tls.ca_cert(self.name)))
        return env

    # ------------------------------------------------------------------ jobs
    def submit(
        self, spec: str | Path | JobSpec | Strings, *, sets: Strings | None = None, now: bool = False
    ) -> Job:
        """Check a job (spec file, JobSpec or command argv) against this cluster and queue it.

        Works while the allocation is still PENDING: the job starts once the cluster is READY.
        Bad input raises ConfigError before anything is written.
        """
        return self.submit_jobs(spec, sets=sets, now=now)[0]

    def submit_jobs(
        self,
        spec: str | Path | JobSpec | Strings,
        *,
        sets: Strings | None = None,
        now: bool = False,
        sweeps: Strings | None = None,
        after: Strings | None = None,
        job_id: str | None = None,
        secrets: Strings | None = None,
    ) -> Jobs:
        """`submit`, for a sweep (one job per combination of `sweeps`, e.g. ["env.LR=1e-6,3e-6"],
        and of the spec's `sweep:` block), with dependencies (`after`: ["ID", "ID:any", ...],
        added to the spec's), a chosen id (`job_id`, as ray job submit's --submission-id) and
        secrets (names of variables of this environment, besides the spec's `secrets:`).
        Every job is checked before the first is queued."""
        if job_id is not None:
            try:
                paths.validate_job_id(job_id)
            except ConfigError as exc:
                raise ConfigError(f"--submission-id: {exc}") from None
            if paths.cluster(self.name).ledger(job_id).exists():
                raise ConfigError(id_taken(job_id, self.name))
        after = after_option(after)
        jobs = prepare_jobs(spec, list(sets or []), self.settle(), Path.cwd(), list(sweeps or []), job_id)
        for one in jobs:
            for request in (one.request, one.resume):
                if request is not None:
                    request.after = [*request.after, *after]
        why = deps.unknown(self.name, jobs[0].request.after, {j.request.id for j in jobs})
        if why:
            raise ConfigError(why)
        new_id = None if job_id or len(jobs) > 1 else new_job_id
        requests = [r for one in jobs for r in (one.request, one.resume) if r is not None]
        for request in requests:
            request.secrets = list(dict.fromkeys([*request.secrets, *(secrets or [])]))
        kept = keep_secrets(self.name, requests)
        try:
            queued = enqueue_all([(one.request, one.resume) for one in jobs], now=now, new_id=new_id)
        except BaseException:
            for nonce in kept:  # (nothing was queued: nothing will read them)
                forget_secrets(self.name, nonce)
            raise
        return [
            Job(self.name, q.record.id, q.record, queued_place=q.place, queued_note=q.note) for q in queued
        ]

    def in_flight(self) -> Strings:
        """Ids of the jobs given to Ray and not yet ended."""
        return active(self.name)

    def states_of(self, ids: Strings) -> dict[str, Strings]:
        """Job ids grouped by the state their ledgers hold now ('?' where one cannot be read)."""
        found: dict[str, Strings] = {}
        for job_id in ids:
            try:
                state = read_job(self.name, job_id).state.value
            except ClusterError:
                state = "?"
            found.setdefault(state, []).append(job_id)
        return found

    def positions(self) -> dict[str, int]:
        """Each queued job's 1-based place in the queue, from one listing of it."""
        return positions(self.name)

    def jobs(self) -> JobRecords:
        """Every job of this cluster's ledger, oldest first."""
        return all_jobs(self.name)

    # ------------------------------------------------------------------ down
    def down(self, timeout: float = 120, clock: Clock = REAL) -> ClusterRecord:
        """End the cluster and its chain: cancel the running allocation, any pending follow-on and
        the grown allocations, wait until SLURM has released them, mark the record."""
        record = self.settle()
        if record.state.is_terminal():
            self._sweep_local(record)
            return record
        backend = allocator(record.backend)
        if record.allocation_id and not backend.remote and backend.info(record.allocation_id) is None:
            host = record.head_host or f"the host named in {record.allocation_id}"  # (a local cluster)
            raise ClusterError(
                f"cluster {self.name} runs on {host} (raystack up --local) and this host cannot stop "
                f"it: run `raystack down {self.name}` on {host}; nothing was changed"
            )
        record = records.update(
            self.name,
            state=ClusterState.STOPPING,
            ending=EndKind.DOWN,
            chain_ended="raystack down",
            message="raystack down",
        )
        live: list[str] = []

        def released() -> bool | None:
            # Re-read each time: the head may submit a follow-on just now (it cancels it itself
            # once it sees `down`, and so does this loop).
            record = records.read(self.name)
            live.clear()
            mine = (record.allocation_id, record.next_allocation_id, *(g.alloc_id for g in record.grown))
            for job in dict.fromkeys(j for j in mine if j):
                info = backend.info(job)
                if info is None or not info.state.is_terminal():
                    backend.cancel(job)
                    live.append(job)
            if not live:
                return True
            backend.forget()  # (asked again after the pause, not from the cache)
            return None

        def late() -> ClusterError:
            return ClusterError(
                f"SLURM job(s) {', '.join(live)} still alive {timeout:.0f}s after scancel; "
                f"check `squeue -j {','.join(live)}`"
            )

        until(released, 0.5, clock, timeout, late)
        record = records.read(self.name)
        if not record.state.is_terminal():
            record = records.update(
                self.name,
                state=ClusterState.STOPPED,
                next_allocation_id=None,
                message="stopped by raystack down",
            )
        settle_orphans(self.name, None, "raystack down", stopped=True)
        self._sweep_local(record)
        return record

    def forget(self) -> Path:
        """Remove an ended cluster's folder: its record, token, queue, ledger and logs. Refused
        while the cluster lives (`down` first). The folder that was removed."""
        record = self.settle()
        if not record.state.is_terminal():
            raise ClusterError(
                f"cluster {self.name} is {record.state.value}: `raystack down {self.name}` first"
            )
        folder = self.folder
        shutil.rmtree(folder)
        return folder

    @staticmethod
    def _sweep_local(record: ClusterRecord) -> None:
        """A local cluster's leftovers (its node program was killed): gone after `down`."""
        if record.allocation_id:
            allocator(record.backend).sweep(record.allocation_id)


def allocation_place(record: ClusterRecord) -> str:
    """Where the cluster's allocation runs, in words: "SLURM job 12", "on this machine as ..."."""
    return allocator(record.backend).place(record.allocation_id)


def loopback_for(name: str) -> str:
    """A loopback address of the cluster's own, 127.0.0.2-127.0.0.251, from a hash of its name."""
    digest = hashlib.sha256(name.encode()).digest()
    return f"127.0.0.{2 + int.from_bytes(digest[:4], 'big') % 250}"
