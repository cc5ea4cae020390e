"""The public Python API for clusters; every CLI verb is one call here.

from raystack import Cluster
c = Cluster.up(nodes=4, profile="isambard", name="grpo")   # submits, waits until READY
c.status(); c.env(); c.down()
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raystack.adapters import local, slurm
from raystack.adapters.ray import Dashboard
from raystack.adapters.slurm import SlurmState
from raystack.allocation import sbatch as allocation
from raystack.allocation.walltime import DOWN
from raystack.client.access import live_dashboard
from raystack.client.job import Job
from raystack.client.reconcile import reconcile
from raystack.errors import ClusterError, ConfigError, RayApiError, SlurmError
from raystack.spec import job as specs
from raystack.spec.job import JobSpec
from raystack.spec.profile import Profile, load_profile
from raystack.spec.resolve import resolve
from raystack.spec.values import size_to_mb
from raystack.store import cluster as records
from raystack.store import files, growth, paths, tls
from raystack.store.cluster import ClusterRecord, ClusterState, read_heartbeat
from raystack.store.files import atomic_write
from raystack.store.ledger import JobRecord, all_jobs
from raystack.store.queue import active, check_open, enqueue, interrupted, settle_orphans, waiting

Progress = Callable[[str], None]
SLURM_POLL_MIN, SLURM_POLL_MAX = 2.0, 10.0  # seconds between SLURM queries while waiting
HEAD_SILENT = 30.0  # seconds without a heartbeat after which a READY head shows as DEGRADED
DEGRADED = "DEGRADED"  # (shown, never recorded: the record keeps what the head last wrote)
Argv = list[str]  # (inside Cluster, `list` is the classmethod)
JobRecords = list[JobRecord]


@dataclass
class ClusterStatus:
    """A snapshot joining the record, SLURM's view and Ray's view of one cluster."""

    name: str
    state: str
    message: str
    slurm_job_id: str | None
    slurm_state: str | None
    slurm_reason: str | None
    time_left_s: int | None
    nodes_expected: int
    nodes_alive: int | None
    gpus: float | None
    cpus: float | None
    dashboard_url: str | None
    ray_error: str | None = None
    running_job: str | None = None
    queued_jobs: int = 0
    chain_index: int = 1
    chain_count: int = 1
    next_job_id: str | None = None  # the chain's next allocation, pending on this one
    next_state: str | None = None
    next_reason: str | None = None
    resuming_jobs: list[str] | None = None  # INTERRUPTED: they resume in the next allocation
    idle_s: float | None = None  # idle (nothing queued, running or attached) for this long
    idle_timeout_s: float | None = None  # autostop after this long idle
    prometheus: str | None = None  # the head's Prometheus (on the head's loopback)

    @property
    def ready(self) -> bool:
        return self.state == ClusterState.READY.value and self.nodes_alive == self.nodes_expected

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ready": self.ready}


class Cluster:
    """A handle on one named cluster in $RAYSTACK_HOME."""

    def __init__(self, name: str):
        self.name = paths.validate_name(name)

    def __repr__(self) -> str:
        return f"Cluster({self.name!r})"

    # ------------------------------------------------------------------ lookup
    @classmethod
    def get(cls, name: str | None = None) -> Cluster:
        """The named cluster, or the only one there is. Raises ClusterError when missing."""
        cluster = cls(records.resolve(name))
        cluster.record()
        return cluster

    @classmethod
    def list(cls) -> list[ClusterRecord]:
        return [cls(n).record() for n in records.list_names()]

    def record(self) -> ClusterRecord:
        return reconcile(records.read(self.name))

    @property
    def folder(self) -> Path:
        return paths.cluster(self.name).root

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
        """Submit an allocation (see allocation.plan for options) and, by default, wait for READY."""
        plan = cls.plan(nodes, **options)
        cluster = cls.submit_plan(plan)
        if wait:
            cluster.wait_ready(progress=progress, timeout=timeout)
        return cluster

    @classmethod
    def plan(cls, nodes: int, **options: Any) -> allocation.AllocationPlan:
        """The allocation `up` would submit (nothing is submitted): counts left at "auto" become
        whole nodes of the partition, read from sinfo."""
        profile = options.pop("profile", "generic")
        prof = profile if isinstance(profile, Profile) else load_profile(profile)
        shape = None
        if allocation.wants_node_shape(prof, options.get("gpus_per_node"), options.get("cpus_per_task")):
            partition = options.get("partition") or prof.partition
            try:
                shape = slurm.node_shape(partition)
            except SlurmError as exc:
                if "is not on PATH" in str(exc):
                    raise
                raise ConfigError(
                    f"whole nodes by default, but sinfo could not say how big they are ({exc}); "
                    "give --gpus-per-node and --cpus-per-task, or a profile that sets them"
                ) from None
        return allocation.plan(nodes, profile=prof, shape=shape, **options)

    @classmethod
    def submit_plan(cls, plan: allocation.AllocationPlan) -> Cluster:
        """Perform a plan: create the folder and token, write the script, sbatch it."""
        assert plan.name and plan.script_path
        if shutil.which("sbatch") is None:
            raise SlurmError(
                "`sbatch` is not on PATH: run raystack on a SLURM login node "
                "(or `module load slurm`), or start the local testbed with slurm/testbed/up"
            )
        cls._check_name_free(plan.name)
        # A live allocation of this name that the record does not know (submitted by hand, or
        # its record lost) would run a second queue runner on the same queue.
        twins = [i for i in slurm.jobs_named(f"raystack-{plan.name}").values() if i.state.is_active()]
        if twins:
            raise ClusterError(
                f"SLURM job {twins[0].job_id} ({twins[0].state.value}) already runs a cluster named "
                f"'{plan.name}': `scancel {twins[0].job_id}` first, or choose another --name"
            )
        cls._prepare(
            plan,
            allocation.render_script(plan),
            chain_count=plan.chain,
            signal_lead=plan.signal_lead,
            sbatch_options=plan.sbatch_options(),
            message="submitting",
        )
        try:
            job_id = slurm.sbatch(plan.sbatch_options(), str(plan.script_path))
        except SlurmError as exc:
            records.update(plan.name, state=ClusterState.FAILED, message=str(exc))
            raise ClusterError(f"SLURM refused the allocation: {exc}") from exc
        records.update(plan.name, slurm_job_id=job_id, message=f"submitted as SLURM job {job_id}")
        return cls(plan.name)

    @staticmethod
    def _prepare(plan: allocation.AllocationPlan, script: str, note: str = "", **fields: Any) -> None:
        """A fresh cluster folder for `plan`: its launch script and its first record."""
        assert plan.name and plan.script_path
        records.create(plan.name)
        if plan.profile.tls:
            tls.create_ca(plan.name)  # fresh, like the token: an earlier cluster's certificates fail
        else:
            shutil.rmtree(tls.folder(plan.name), ignore_errors=True)
        records.clear_node_entries(plan.name)
        atomic_write(plan.script_path, script, mode=0o700)
        records.write(
            ClusterRecord(
                name=plan.name,
                profile=plan.profile.name,
                nodes_expected=plan.nodes or 0,
                tls=plan.profile.tls,
                gpus_per_node=plan.gpus_per_node,
                cpus_per_node=plan.cpus_per_task or 0,
                history=[{"state": "SUBMITTED", "time": time.time(), "message": note}],
                **fields,
            )
        )

    @staticmethod
    def space_warning(profile: Profile) -> str | None:
        """Why RAYSTACK_HOME's filesystem may run out of room for the cluster folder (the jobs'
        logs, Ray's copied logs, usage samples), or None. Quotas are not visible to statvfs:
        what a site's quota tool says (`quota`, `lfs quota`) is the truth."""
        home = paths.home()
        free = growth.free_bytes(home)
        cap = size_to_mb(profile.folder_cap) * 2**20 if profile.folder_cap else 0
        if free is None or (free >= growth.SMALL_FREE and free >= cap):
            return None
        return (
            f"RAYSTACK_HOME ({home}) has {free / 2**30:.1f} GB free; the cluster folder may take up "
            f"to {profile.folder_cap or 'any size'} (profile folder_cap): jobs' logs and Ray's copied "
            "logs need room there; set RAYSTACK_HOME to a larger filesystem (it must be shared)"
        )

    @staticmethod
    def _check_name_free(name: str) -> None:
        if records.exists(name):
            old = reconcile(records.read(name))
            if not old.state.is_terminal():
                raise ClusterError(
                    f"name '{name}' is in use by a live cluster (allocation {old.slurm_job_id}, "
                    f"{old.state.value}): `raystack down {name}` first, or choose another --name"
                )

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
        plan, gpu_ids = cls.plan_local(gpus=gpus, cpus=cpus, profile=profile, name=name)
        cluster = cls.start_local(plan, gpu_ids)
        if wait:
            cluster.wait_ready(progress=progress, timeout=timeout)
        return cluster

    @classmethod
    def plan_local(
        cls,
        *,
        gpus: int | None = None,
        cpus: int | None = None,
        profile: str | Profile = "generic",
        name: str = "local",
    ) -> tuple[allocation.AllocationPlan, Argv]:
        prof = profile if isinstance(profile, Profile) else load_profile(profile)
        ids, cores = local.gpu_ids(), local.cpu_count()
        if cpus is not None and not 1 <= cpus <= cores:
            raise ConfigError(
                f"--cpus: {cpus} but this machine gives this process {cores} CPUs; use 1 to {cores}"
            )
        if gpus is not None and gpus < 0:
            raise ConfigError(f"--gpus: {gpus} is negative; use 0 for a CPU-only cluster")
        if gpus is not None and ids and gpus > len(ids):
            raise ConfigError(
                f"--gpus: {gpus} but this machine has {len(ids)} GPUs ({local.GPU_SOURCE}); "
                f"use at most {len(ids)}"
            )
        count = len(ids) if gpus is None else gpus
        # Without a GPU to see (a login node, CI), --gpus G gives Ray G logical GPUs, as the testbed
        # does: placement and masking can be tested; CUDA cannot.
        ids = ids[:count] if ids else [str(i) for i in range(count)]
        plan = allocation.plan(1, profile=prof, name=name, gpus_per_node=count, cpus_per_task=cpus or cores)
        return plan, ids

    @classmethod
    def start_local(cls, plan: allocation.AllocationPlan, gpu_ids: Argv) -> Cluster:
        assert plan.name and plan.script_path and plan.cluster_paths
        cls._check_name_free(plan.name)
        job_id = local.new_id()
        cls._prepare(
            plan,
            allocation.render_local_script(plan, gpu_ids),
            note="local",
            slurm_job_id=job_id,
            message=f"started on this machine as {job_id}",
        )
        # Its output goes where a SLURM node's does: logs/node-<host>.log, named in every error.
        local.start(job_id, plan.script_path, plan.cluster_paths.node_log(local.this_host()))
        return cls(plan.name)

    def wait_ready(
        self,
        progress: Progress | None = None,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> ClusterRecord:
        """Poll the record until READY; raise when it ends first.

        SLURM is asked too (has the allocation started? did it end?), rate-limited: every 2 s at
        first, backing off to every 10 s while it stays PENDING and once it runs (the head then
        writes progress into the record itself).
        """
        say = progress or (lambda _msg: None)
        start, last_slurm, last_said, interval = clock(), -1e9, "", SLURM_POLL_MIN
        while True:
            record = records.read(self.name)
            if record.state is ClusterState.READY:
                if not local.is_local(record.slurm_job_id):
                    self.check_locks(record, say)
                return record
            if clock() - last_slurm >= interval:
                last_slurm = clock()
                interval = min(interval * 1.5, SLURM_POLL_MAX)
                if record.state is ClusterState.STARTING:
                    interval = SLURM_POLL_MAX
                info = slurm.job_info(record.slurm_job_id) if record.slurm_job_id else None
                record = reconcile(record, info)
                if info is not None and info.state is SlurmState.PENDING:
                    reason = info.reason if info.reason not in ("", "None") else "not scheduled yet"
                    said = f"PENDING in SLURM (job {record.slurm_job_id}, reason: {reason})"
                    if said != last_said:
                        say(last_said := said)
            if record.state.is_terminal():
                logs = str(paths.cluster(self.name).logs)
                hint = "" if logs in record.message else f" (logs: {logs})"
                raise ClusterError(f"cluster {self.name} {record.state.value}: {record.message}{hint}")
            if record.state is ClusterState.STARTING:
                said = f"STARTING: {record.nodes_joined}/{record.nodes_expected} nodes joined"
                if said != last_said:
                    say(last_said := said)
            if timeout is not None and clock() - start > timeout:
                raise ClusterError(
                    f"cluster {self.name} not READY after {timeout:.0f}s "
                    f"({record.state.value}: {record.message}); it is still queued or "
                    f"starting: `raystack status {self.name}` or `raystack down {self.name}`"
                )
            sleep(0.25)

    def check_locks(self, record: ClusterRecord, say: Progress) -> bool:
        """Whether this host sees the lock the head's node program holds on .lockprobe. Where it
        does not (mount options `localflock`, NFS `nolock`: each host has its own locks), a
        `cancel` here and the runner's `start` on the head could both win: the cluster folder then
        uses link locks, which need only link(2) to be atomic. True when locks are shared."""
        p = paths.cluster(self.name)
        beat = read_heartbeat(self.name)
        alive = beat is not None and time.time() - float(beat.get("t", 0)) < HEAD_SILENT
        seen = files.lock_seen(p, record.slurm_job_id) if alive else None
        if seen is False and not files.uses_link_locks(p):
            files.use_link_locks(p, f"flock taken on the head is not seen from {socket.gethostname()}")
            say(
                f"warning: {paths.home()} does not share flock locks between this host and the head "
                "(mount option localflock or nolock?): this cluster uses link locks instead"
            )
        return seen is not False

    # ------------------------------------------------------------------ inspect
    def status(self) -> ClusterStatus:
        record = self.record()
        info = slurm.job_info(record.slurm_job_id) if record.slurm_job_id else None
        time_left = None
        if info and info.state is SlurmState.RUNNING and info.end_time:
            time_left = max(0, int(info.end_time - time.time()))
        nodes = gpus = cpus = None
        ray_error = None
        if record.state in (ClusterState.READY, ClusterState.STARTING) and record.dashboard_url:
            try:
                alive = live_dashboard(record, info).alive_nodes(timeout=5)
                nodes = len(alive)
                gpus = sum(n.resources.get("GPU", 0) for n in alive)
                cpus = sum(n.resources.get("CPU", 0) for n in alive)
            except RayApiError as exc:
                ray_error = str(exc)
            except ClusterError as exc:  # (SLURM says it ended, or did not answer: no token sent)
                ray_error = str(exc)
        running = active(self.name)
        nxt = slurm.job_info(record.next_job_id) if record.next_job_id else None
        state, message = record.state.value, record.message
        silent = self.head_silent(record)
        if silent is not None:
            state = DEGRADED
            message = (
                f"the head's node program has not been heard from for {silent:.0f}s (its log: "
                f"{paths.cluster(self.name).node_log(record.head_host or '?')}); {message}"
            )
        return ClusterStatus(
            name=self.name,
            state=state,
            message=message,
            slurm_job_id=record.slurm_job_id,
            slurm_state=info.state.value if info else None,
            slurm_reason=info.reason if info else None,
            time_left_s=time_left,
            nodes_expected=record.nodes_expected,
            nodes_alive=nodes,
            gpus=gpus,
            cpus=cpus,
            dashboard_url=record.dashboard_url,
            ray_error=ray_error,
            running_job=running[0] if running else None,
            queued_jobs=len(waiting(self.name)),
            chain_index=record.chain_index,
            chain_count=record.chain_count,
            next_job_id=record.next_job_id,
            next_state=nxt.state.value if nxt else None,
            next_reason=nxt.reason if nxt else None,
            resuming_jobs=interrupted(self.name),
            idle_s=round(time.time() - record.idle_since, 1)
            if record.idle_since and record.state is ClusterState.READY
            else None,
            idle_timeout_s=record.idle_timeout,
            prometheus=record.prometheus,
        )

    def head_silent(self, record: ClusterRecord) -> float | None:
        """Seconds since the head's last heartbeat, when a live-looking cluster's head has been
        silent for over HEAD_SILENT seconds (a READY record then shows as DEGRADED); else None."""
        if record.state is not ClusterState.READY:
            return None
        beat = read_heartbeat(self.name)
        if beat is None or beat.get("allocation") != record.slurm_job_id:
            return None  # (a head of an older raystack beats not at all: judge what can be judged)
        age = time.time() - float(beat.get("t", 0))
        return age if age > HEAD_SILENT else None

    def dashboard(self) -> Dashboard:
        """An authenticated client of this cluster's dashboard (Jobs and State APIs), once SLURM
        confirms its allocation runs (client/access.py)."""
        return live_dashboard(self.record())

    def tunnel(self, login_host: str | None = None) -> dict[str, str]:
        """How to open the dashboard from a laptop: an ssh tunnel on a loopback address of this
        cluster's own (127.0.0.x from its name), so two clusters' login cookies (scoped to the
        host) never mix, and how to get the token it asks for."""
        record = self.record()
        port = record.ports.get("dashboard")
        if not record.head_ip or not port:
            raise ClusterError(f"cluster {self.name} has no dashboard yet ({record.state.value})")
        local_ip = loopback_for(self.name)
        host = login_host or socket.gethostname()
        info = {
            "url": f"{'https' if record.tls else 'http'}://{local_ip}:{port}",
            "tunnel": f"ssh -N -L {local_ip}:{port}:{record.head_ip}:{port} {host}",
            "login": f'eval "$(raystack env {self.name})" && ray get-auth-token',
        }
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
                f"wait with `raystack up` or check `raystack status {self.name}`"
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
        self, spec: str | Path | JobSpec | Argv, *, sets: Argv | None = None, now: bool = False
    ) -> Job:
        """Check a job (spec file, JobSpec or command argv) against this cluster and queue it.

        Works while the allocation is still PENDING: the job starts once the cluster is READY.
        Bad input raises ConfigError before anything is written.
        """
        record = self.record()
        check_open(self.name)
        if isinstance(spec, list):
            job_spec, base, source, file = specs.command_spec(spec, sets), Path.cwd(), "command", None
        elif isinstance(spec, str | Path):
            path = Path(spec)
            job_spec, base = specs.load_spec(path, sets), path.resolve().parent
            source, file = f"job spec {path}", str(path.resolve())
        else:
            job_spec, base, source, file = spec, Path.cwd(), f"job spec {spec.name}", None
        request = resolve(job_spec, record, base, source, file)
        resumed = specs.resumed_spec(job_spec, source)
        resume_request = resolve(resumed, record, base, f"{source} (resume)", file) if resumed else None
        record_ = enqueue(request, now=now, new_id=specs.new_job_id, resume_request=resume_request)
        return Job(self.name, record_.id)

    def jobs(self) -> JobRecords:
        """Every job of this cluster's ledger, oldest first."""
        return all_jobs(self.name)

    # ------------------------------------------------------------------ down
    def down(self, timeout: float = 120, sleep: Callable[[float], None] = time.sleep) -> ClusterRecord:
        """End the cluster and its chain: cancel the running allocation and any pending follow-on,
        wait until SLURM has released them, mark the record."""
        record = self.record()
        if record.state.is_terminal():
            self._sweep_local(record)
            return record
        record = records.update(
            self.name,
            state=ClusterState.STOPPING,
            ending=DOWN,
            chain_ended="raystack down",
            message="raystack down",
        )
        deadline = time.monotonic() + timeout
        while True:
            # Re-read each time: the head may submit a follow-on just now (it cancels it itself
            # once it sees `down`, and so does this loop).
            record = records.read(self.name)
            live = []
            for job in dict.fromkeys(j for j in (record.slurm_job_id, record.next_job_id) if j):
                info = slurm.job_info(job)
                if info is None or not info.state.is_terminal():
                    slurm.scancel(job)
                    live.append(job)
            if not live:
                break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"SLURM job(s) {', '.join(live)} still alive {timeout:.0f}s after scancel; "
                    f"check `squeue -j {','.join(live)}`"
                )
            sleep(0.5)
            slurm.forget()
        record = records.read(self.name)
        if not record.state.is_terminal():
            record = records.update(
                self.name, state=ClusterState.STOPPED, next_job_id=None, message="stopped by raystack down"
            )
        settle_orphans(self.name, None, "raystack down")
        self._sweep_local(record)
        return record

    @staticmethod
    def _sweep_local(record: ClusterRecord) -> None:
        """A local cluster's leftovers (its node program was killed): gone after `down`."""
        if local.is_local(record.slurm_job_id):
            local.sweep(str(record.slurm_job_id))


def loopback_for(name: str) -> str:
    """A loopback address of the cluster's own, 127.0.0.2-127.0.0.251, from a hash of its name."""
    digest = hashlib.sha256(name.encode()).digest()
    return f"127.0.0.{2 + int.from_bytes(digest[:4], 'big') % 250}"
