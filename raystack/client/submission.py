"""An allocation plan carried out: a fresh cluster folder (its script and first record, claimed
under the folder's lock), the scheduler asked and its answer recorded (an allocation it queued
without answering found again). Every backend the same way: `up --local` is the local one."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from raystack.adapters.allocator import Allocator, allocator
from raystack.client.allocate import AllocationPlan, log, render_script
from raystack.client.fits import why_refused
from raystack.client.reconcile import settle
from raystack.errors import (
    ClusterError,
    SchedulerError,
    SchedulerMissing,
    SchedulerUnavailable,
)
from raystack.spec.profile import Profile
from raystack.store import claims, paths, tls
from raystack.store import cluster as records
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.files import atomic_write


def submit(p: AllocationPlan) -> ClusterRecord:
    """Perform a plan: create the folder and token, write the script, sbatch it. The record."""
    assert p.name and p.script_path
    check_name_free(p.name)
    mine = os.path.realpath(p.script_path)
    backend = allocator(p.backend)
    _no_twin(backend, p.name, mine)
    request = p.request()
    prepare(
        p,
        render_script(p),
        chain_count=p.chain,
        signal_lead=p.signal_lead,
        request=request.dump(),
        backend=p.backend,
        message="submitting" if backend.remote else "starting",
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
    done = "submitted as" if backend.remote else "started"
    return _recorded(p.name, backend, alloc_id, f"{done} {backend.place(alloc_id)}")


def _no_twin(backend: Allocator, name: str, mine: str) -> None:
    """Refuse a live allocation of this name that the record does not know (submitted by hand, or
    its record lost): it would run a second queue runner on the same queue. One that runs another
    RAYSTACK_HOME's cluster folder (another project's cluster of the same name) is no twin."""
    try:
        named = backend.named(f"raystack-{name}")
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
        and not (i.command.endswith(f"/{name}/{paths.SCRIPT}") and os.path.realpath(i.command) != mine)
    ]
    if twins:
        raise ClusterError(
            f"{backend.place(twins[0].alloc_id)} ({twins[0].state_text}) already runs a cluster named "
            f"'{name}': end it first (`scancel {twins[0].alloc_id}`), or choose another --name"
        )


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
        walltime=p.walltime if allocator(p.backend).walltime else None,
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
