"""An allocation plan carried out: a fresh cluster folder (its script and first record, claimed
under the folder's lock), the scheduler asked and its answer recorded (an allocation it queued
without answering found again), or a --local cluster planned and started on this machine."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from typing import Any

from raystack.adapters import local
from raystack.adapters.allocator import Allocator, allocator
from raystack.client.allocate import AllocationPlan, log, plan, render_script
from raystack.client.fits import why_refused
from raystack.client.reconcile import settle
from raystack.errors import (
    ClusterError,
    ConfigError,
    SchedulerError,
    SchedulerMissing,
    SchedulerUnavailable,
)
from raystack.spec import rayenv
from raystack.spec.profile import Profile, load_profile
from raystack.store import claims, paths, tls
from raystack.store import cluster as records
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.files import atomic_write


def submit(p: AllocationPlan) -> ClusterRecord:
    """Perform a plan: create the folder and token, write the script, sbatch it. The record."""
    assert p.name and p.script_path
    check_name_free(p.name)
    # A live allocation of this name that the record does not know (submitted by hand, or
    # its record lost) would run a second queue runner on the same queue; one that runs another
    # RAYSTACK_HOME's cluster folder (another project's cluster of the same name) is no twin.
    mine = os.path.realpath(p.script_path)
    backend = allocator(p.backend)
    try:
        named = backend.named(f"raystack-{p.name}")
    except SchedulerMissing:  # (no SLURM commands on this host: said with the fix)
        raise
    except SchedulerUnavailable as exc:
        raise ClusterError(
            f"SLURM did not answer ({exc}): nothing was submitted; `raystack up` again once it "
            "answers (`squeue` works)"
        ) from exc
    twins = [
        i
        for i in named
        if i.state.is_active()
        and not (i.command.endswith(f"/{p.name}/{paths.SCRIPT}") and os.path.realpath(i.command) != mine)
    ]
    if twins:
        raise ClusterError(
            f"{backend.place(twins[0].alloc_id)} ({twins[0].state_text}) already runs a cluster named "
            f"'{p.name}': end it first (`scancel {twins[0].alloc_id}`), or choose another --name"
        )
    request = p.request()
    prepare(
        p,
        render_script(p),
        chain_count=p.chain,
        signal_lead=p.signal_lead,
        request=request.dump(),
        backend=p.backend,
        message="submitting",
    )
    try:
        alloc_id = backend.submit(p.script_path, request)
    except SchedulerUnavailable as exc:  # (its answer lost: SLURM may have queued it all the same)
        alloc_id = _queued_all_the_same(backend, p.name, mine, exc)
    except SchedulerError as exc:
        claims.update_claim(p.name, state=ClusterState.FAILED, message=str(exc))
        why = why_refused(
            p.partition, p.nodes or 0, p.gpus_per_node, p.cpus_per_task, p.mem, p.profile.constraint
        )
        raise ClusterError(f"SLURM refused the allocation: {exc}{why}") from exc
    return _recorded(p.name, backend, alloc_id, f"submitted as {backend.place(alloc_id)}")


def _recorded(name: str, backend: Allocator, alloc_id: str, message: str) -> ClusterRecord:
    """The allocation, written into the record this `up` began; cancelled if that is no longer
    its claim (`raystack down`, or another `up`, while sbatch ran)."""
    if done := claims.update_claim(name, allocation_id=alloc_id, message=message):
        return done
    backend.cancel(alloc_id)
    raise ClusterError(f"cluster {name} was stopped or begun anew meanwhile: {alloc_id} cancelled")


def _queued_all_the_same(backend: Allocator, name: str, script: str, exc: SchedulerError) -> str:
    """sbatch got no answer from slurmctld (a timeout): the allocation may have been queued
    anyway. Asked once (never submitted again): its id when SLURM has a job running this very
    script; otherwise the record is FAILED and the error says what to look for."""
    try:
        queued = [
            i
            for i in backend.named(f"raystack-{name}")
            if i.state.is_active() and os.path.realpath(i.command) == script  # (not the last one's, ended)
        ]
    except SchedulerError:
        queued = []
    if queued:
        log.warning("raystack: warning: sbatch did not answer (%s), but SLURM queued the allocation", exc)
        return queued[0].alloc_id
    claims.update_claim(name, state=ClusterState.FAILED, message=f"sbatch did not answer: {exc}")
    raise ClusterError(
        f"SLURM did not answer sbatch ({exc}); it may have queued the allocation all the same: "
        f"`squeue --name raystack-{name}` shows it if so, and the cluster then starts (`raystack wait "
        f"{name}`), or `scancel` it; else `raystack up` again"
    ) from exc


def prepare(p: AllocationPlan, script: str, note: str = "", **fields: Any) -> None:
    """A fresh cluster folder for a plan: its launch script and its first record. Little room
    where it goes is said first (said, not refused: a quota may allow it)."""
    assert p.name and p.script_path and p.cluster_paths
    if warning := space_warning(p.profile):
        log.warning("raystack: warning: %s", warning)
    claims.begin(
        p.name,
        profile=p.profile.name,
        nodes_expected=p.nodes or 0,
        tls=p.profile.tls,
        gpus_per_node=p.gpus_per_node,
        cpus_per_node=p.cpus_per_task or 0,
        walltime=p.walltime if p.backend != "local" else None,
        max_nodes=p.profile.max_nodes,
        history=[{"state": "SUBMITTED", "time": time.time(), "message": note}],
        **fields,
    )
    if p.profile.tls:
        tls.create_ca(p.name)  # fresh, like the token: an earlier cluster's certificates fail
    else:
        shutil.rmtree(p.cluster_paths.tls, ignore_errors=True)
    atomic_write(p.script_path, script, mode=0o700)


SMALL_FREE = 5 * 2**30  # `up` warns when RAYSTACK_HOME's filesystem has less than this free


def space_warning(profile: Profile) -> str | None:
    """Why RAYSTACK_HOME's filesystem may run out of room for the cluster folder (the jobs'
    logs, Ray's copied logs, usage samples), or None. Quotas are not visible to statvfs:
    what a site's quota tool says (`quota`, `lfs quota`) is the truth."""
    home = paths.home()
    try:
        free = shutil.disk_usage(home).free  # (this user's: statvfs's f_bavail)
    except OSError:
        return None
    cap = profile.folder_cap.bytes if profile.folder_cap else 0
    if free >= SMALL_FREE and free >= cap:
        return None
    return (
        f"RAYSTACK_HOME ({home}) has {free / 2**30:.1f} GB free; the cluster folder may take up "
        f"to {profile.folder_cap or 'any size'} (profile folder_cap): jobs' logs and Ray's copied "
        "logs need room there; set RAYSTACK_HOME to a larger filesystem (it must be shared)"
    )


def check_name_free(name: str) -> None:
    if records.exists(name) and (why := claims.in_use(settle(records.read(name)))):
        raise ClusterError(why)


def plan_local(
    *,
    gpus: int | None = None,
    cpus: int | None = None,
    profile: str | Profile = "generic",
    name: str = "local",
) -> tuple[AllocationPlan, list[str]]:
    """A one-node plan for this machine, and the GPU ids it gets."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    rayenv.check_floor()
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
    planned = plan(1, profile=prof, name=name, gpus_per_node=count, cpus_per_task=cpus or cores)
    return replace(planned, backend="local"), ids


def start_local(p: AllocationPlan, gpu_ids: list[str]) -> ClusterRecord:
    """Start a local plan's node program on this machine, detached. The record."""
    assert p.name and p.script_path and p.cluster_paths
    check_name_free(p.name)
    prepare(p, render_script(p, gpu_ids), note="local", backend="local", message="starting")
    backend = allocator("local")
    # Its output goes where a SLURM node's does: logs/node-<host>.log, named in every error.
    log_file = p.cluster_paths.node_log(local.this_host())
    alloc_id = backend.submit(p.script_path, replace(p.request(), output=str(log_file)))
    return _recorded(p.name, backend, alloc_id, f"started {backend.place(alloc_id)}")
