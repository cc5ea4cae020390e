"""Plan, then act: build the exact sbatch argv and allocation script, then submit it.

`plan()` is pure (validated inputs in, an AllocationPlan out) and is what `raystack up
--dry-run` prints; `submit()` (or `start_local()`) performs it. The script is rendered by
`render_script`, a pure function snapshot-tested against golden files.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from raystack import durations
from raystack.adapters import local
from raystack.adapters.allocator import Allocator, NodeShape, Request, Script, allocator
from raystack.client.fits import why_refused, within
from raystack.client.reconcile import settle
from raystack.durations import duration_text, parse_duration
from raystack.errors import (
    ClusterError,
    ConfigError,
    NoSuchPartition,
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
from raystack.store.paths import ClusterPaths

log = logging.getLogger("raystack")


@dataclass(frozen=True)
class AllocationPlan:
    """Everything `sbatch` will be given. `name`/`home` None = taken from the environment."""

    profile: Profile
    nodes: int | None
    name: str | None
    home: str | None
    time: str | None  # sbatch's --time text
    walltime: int | None = None  # its seconds (plan() reads `time` once for both)
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None
    note: str = ""  # what was asked and why (whole nodes: read from sinfo)
    chain: int = 1  # allocations in all: the cluster lives across this many walltimes
    signal_lead: int = 600  # seconds before the end at which SLURM sends USR1
    python: str = "python3"
    extra_sbatch: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    backend: str = "slurm"  # which scheduler gives the allocation (adapters/allocator.py)

    @cached_property
    def cluster_paths(self) -> ClusterPaths | None:
        if not (self.home and self.name):
            return None
        return ClusterPaths(self.name, Path(self.home) / "clusters" / self.name)

    @property
    def script_path(self) -> Path | None:
        return self.cluster_paths.script if self.cluster_paths else None

    def request(self, after: str | None = None) -> Request:
        """The allocation it asks for, in raystack's words (the adapter turns it into sbatch's)."""
        p = self.profile
        return Request(
            name=f"raystack-{self.name}" if self.name else "raystack",
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            gpu_type=p.gpu_type,
            cpus_per_node=self.cpus_per_task,
            memory=self.mem,
            time=self.time,
            queue=self.partition,
            account=self.account,
            qos=p.qos,
            constraint=p.constraint,
            reservation=p.reservation,
            gres=p.gres,
            exclusive=p.exclusive,
            output=str(self.cluster_paths.allocation_log("%j")) if self.cluster_paths else None,
            warn_before=self.signal_lead,
            after=after,
            native=self.extra_sbatch,
        )

    def argv(self) -> list[str]:
        """The submit command a person could type (`up --dry-run`)."""
        return allocator(self.backend).argv(self.script_path or Path(paths.SCRIPT), self.request())


def wants_node_shape(profile: Profile, gpus_per_node: int | None, cpus_per_task: int | None) -> bool:
    """Whether planning needs the partition's node size (a count left at "auto")."""
    gpus = profile.gpus_per_node if gpus_per_node is None else gpus_per_node
    cpus = profile.cpus_per_task if cpus_per_task is None else cpus_per_task
    return "auto" in (gpus, cpus)


def plan(
    nodes: int,
    *,
    profile: str | Profile = "generic",
    name: str = "default",
    time: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    extra_sbatch: list[str] | None = None,
    python: str | None = None,
    shape: NodeShape | None = None,
    chain: int | None = None,
    signal_lead: str | float | None = None,
) -> AllocationPlan:
    """Validate the request against the profile and build the plan (nothing is submitted).

    Counts left at "auto" (the default) become a whole node's: `shape` is the partition's node
    size, which the caller reads from sinfo (slurm.node_shape) when `wants_node_shape`.
    """
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    rayenv.check_floor()
    _check_counts(nodes, gpus_per_node, cpus_per_task, prof.max_nodes)
    native = [allocator(prof.backend).check_native(o) for o in extra_sbatch or []]  # (each once)
    name = paths.validate_name(name)
    walltime = durations.validate_time(time) if time else prof.time  # (the profile's: read at load)
    links = _links(prof.chain if chain is None else chain)
    lead, lead_note = _signal_lead(prof, signal_lead, walltime)
    gpus, cpus, mem, note = _node_size(
        prof.gpus_per_node if gpus_per_node is None else gpus_per_node,
        prof.cpus_per_task if cpus_per_task is None else cpus_per_task,
        prof.mem,
        shape,
    )
    if shape is not None:
        within(shape, nodes, gpus, cpus)
    return AllocationPlan(
        profile=prof,
        nodes=nodes,
        name=name,
        home=str(paths.home().resolve()),
        time=walltime,
        walltime=walltime.seconds,
        partition=partition or prof.partition,
        account=account or prof.account,
        gpus_per_node=gpus,
        cpus_per_task=cpus,
        mem=mem,
        note="; ".join(n for n in (note, lead_note) if n),
        chain=links,
        signal_lead=max(1, round(lead)),
        python=python or sys.executable,
        extra_sbatch=(*prof.extra_sbatch, *native),
        env=dict(prof.env),
        backend=prof.backend,
    )


def _check_counts(
    nodes: int,
    gpus_per_node: int | None,
    cpus_per_task: int | None,
    max_nodes: int | None = None,
) -> None:
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ConfigError(f"--nodes: {nodes!r} is not a positive number of nodes; use e.g. --nodes 4")
    if max_nodes is not None and max_nodes < nodes:
        raise ConfigError(f"--max-nodes {max_nodes} is less than --nodes {nodes}; grow to at least {nodes}")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise ConfigError(f"--gpus-per-node: {gpus_per_node} is negative; use 0 for CPU-only nodes")
    if cpus_per_task is not None and cpus_per_task < 1:
        raise ConfigError(f"--cpus-per-task: {cpus_per_task} is less than 1 CPU")


def _links(links: object) -> int:
    if isinstance(links, bool) or not isinstance(links, int) or not 1 <= links <= 1000:
        raise ConfigError(
            f"--chain: {links!r} is not a number of allocations from 1 to 1000; use e.g. --chain 3"
        )
    return links


def _signal_lead(
    prof: Profile, signal_lead: str | float | None, walltime: durations.Walltime
) -> tuple[float, str]:
    """Seconds before the walltime end at which SLURM warns (less than the walltime), and a note
    when the profile's own lead did not fit a short walltime (a quarter of it is used then)."""
    try:
        lead = prof.signal_lead if signal_lead is None else parse_duration(signal_lead, limit=65535)
    except ValueError as exc:
        raise ConfigError(f"--signal-lead: {exc}") from None
    if lead < walltime.seconds:
        return lead, ""
    if signal_lead is None:  # (the profile's, for longer walltimes: `up -t 10` must just work)
        short = max(1, walltime.seconds // 4)
        return short, (
            f"the walltime {duration_text(walltime.seconds)} is not longer than profile {prof.name}'s "
            f"signal_lead ({duration_text(lead)}): SLURM warns {duration_text(short)} before the end "
            "(--signal-lead to choose)"
        )
    raise ConfigError(
        f"--signal-lead: {duration_text(lead)} is not less than the walltime {walltime} "
        f"({duration_text(walltime.seconds)}); lower it (e.g. --signal-lead 60s)"
    )


def _node_size(
    gpus: int | str, cpus: int | str | None, mem: str | None, shape: NodeShape | None
) -> tuple[int, int | None, str | None, str]:
    """(GPUs, CPUs, memory, note) per node: counts left at "auto" become a whole node's."""
    note = ""
    if "auto" in (gpus, cpus):
        if shape is None:
            raise ConfigError(
                "whole nodes need the partition's node size from sinfo; give --gpus-per-node and "
                "--cpus-per-task (or a profile that sets them)"
            )
        auto = [(w, n) for w, v, n in (("CPUs", cpus, shape.cpus), ("GPUs", gpus, shape.gpus)) if v == "auto"]
        gpus = shape.gpus if gpus == "auto" else gpus
        cpus = shape.cpus if cpus == "auto" else cpus
        mem = mem if mem is not None else "0"  # with every CPU: all of the node's memory too
        smallest = "" if shape.uniform else " (the smallest node: they differ)"
        note = (
            f"whole nodes: {' and '.join(f'{n} {w}' for w, n in auto)} per node, all memory, as partition "
            f"{shape.partition}'s nodes have{smallest} (sinfo; {' and '.join(w for w, _ in auto)} "
            "were 'auto'); "
            "ask less with --cpus-per-task / --gpus-per-node or a profile"
        )
    assert isinstance(gpus, int) and (cpus is None or isinstance(cpus, int))
    return gpus, cpus, mem, note


def environment(plan: AllocationPlan) -> list[str]:
    """The cluster folder, the profile's setup and env: the start of every launch script."""
    q = shlex.quote
    p = plan.profile
    env = {**p.node_env(), **plan.env}
    lines = [
        "",
        "# Cluster folder on the shared filesystem (the meeting point with the raystack client).",
        f"export RAYSTACK_HOME={q(plan.home)}"
        if plan.home
        else 'export RAYSTACK_HOME="${RAYSTACK_HOME:-$HOME/.raystack}"',
        f"export RAYSTACK_CLUSTER={q(plan.name)}"
        if plan.name
        else 'export RAYSTACK_CLUSTER="${RAYSTACK_CLUSTER:-slurm-$SLURM_JOB_ID}"',
        f"export RAYSTACK_PROFILE={q(p.name)}",
        f"RAYSTACK_PYTHON={q(plan.python)}"
        if plan.python != "python3"
        else 'RAYSTACK_PYTHON="${RAYSTACK_PYTHON:-python3}"',
    ]
    if p.setup:
        # NOTE: many module and conda activate scripts read unset variables: not under `set -u`.
        lines += ["", "# Profile setup (modules, virtualenv, ...)", "set +u", *p.setup, "set -u"]
    lines += ["", "# Environment for Ray and every job (profile env)"]
    lines += [f"export {key}={q(value)}" for key, value in env.items()]
    return lines


def render_script(plan: AllocationPlan, gpu_ids: list[str] | None = None) -> str:
    """The allocation script of the plan's backend around raystack's environment lines."""
    return allocator(plan.backend).render(
        Script(
            request=plan.request(),
            environment=environment(plan),
            profile=plan.profile.name,
            note=plan.note,
            path=plan.script_path,
            gpu_ids=tuple(gpu_ids or ()),
        )
    )


def hand_template() -> str:
    """slurm/raystack.sbatch: the generic script a user can `sbatch --nodes=N` by hand."""
    prof = load_profile("generic").model_copy(update={"gpus_per_node": 0, "cpus_per_task": None})
    return render_script(AllocationPlan(profile=prof, nodes=None, name=None, home=None, time=None))


# ---------------------------------------------------------------------------- acting on a plan
def plan_on_partition(nodes: int, **options: Any) -> AllocationPlan:
    """`plan`, with counts left at "auto" made whole nodes of the partition (read from sinfo)."""
    profile = options.pop("profile", "generic")
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    shape = None
    if wants_node_shape(prof, options.get("gpus_per_node"), options.get("cpus_per_task")):
        partition = options.get("partition") or prof.partition
        try:
            shape = allocator(prof.backend).node_shape(partition)
        except SchedulerUnavailable:  # (not there, or no answer: the caller says what it means for it)
            raise
        except NoSuchPartition as exc:
            raise ConfigError(str(exc)) from None
        except SchedulerError as exc:
            raise ConfigError(
                f"whole nodes by default, but sinfo could not say how big they are ({exc}); "
                "give --gpus-per-node and --cpus-per-task, or a profile that sets them"
            ) from None
    given = options.get("time")
    planned = plan(nodes, profile=prof, shape=shape, **options)
    _within_time_limit(planned, "--time" if given else f"profile {prof.name}'s time")
    return planned


def _within_time_limit(p: AllocationPlan, what: str) -> None:
    """A walltime over the partition's limit is refused here: SLURM would refuse it, or (where
    it does not enforce partition limits at submit) leave it PENDING (PartitionTimeLimit) for
    ever. sinfo's answer helps, never gates: without one, SLURM decides."""
    if not p.walltime:
        return
    try:
        found = allocator(p.backend).time_limit(p.partition)
    except SchedulerError:
        return
    if found is not None and found[1] is not None and p.walltime > found[1]:
        raise ConfigError(
            f"{what} {p.time}: partition {found[0]} allows at most {durations.dhms_text(found[1])} "
            "(sinfo); ask at most that, and add --chain N to run on across N allocations"
        )


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
