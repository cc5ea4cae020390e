"""Plan, then act: build the exact sbatch argv and allocation script, then submit it.

`plan()` is pure (validated inputs in, an AllocationPlan out) and is what `raystack up
--dry-run` prints; `client/submission.submit()` performs it, on whichever backend the profile
names (`up --local`: the local one). The script is rendered by
`render_script`, a pure function snapshot-tested against golden files.
"""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from raystack import durations
from raystack.adapters.allocator import Allocator, NodeShape, Request, Script, allocator
from raystack.client.fits import within
from raystack.durations import duration_text, parse_duration
from raystack.errors import (
    ConfigError,
    NoSuchPartition,
    SchedulerError,
    SchedulerUnavailable,
)
from raystack.spec import rayenv
from raystack.spec.profile import Profile, load_profile
from raystack.store import paths
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
    native: tuple[str, ...] = ()  # options in the scheduler's own words: the profile's, then up's
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
            native=self.native,
        )

    def argv(self) -> list[str]:
        """The submit command a person could type (`up --dry-run`)."""
        return allocator(self.backend).argv(self.script_path or Path(paths.SCRIPT), self.request())


def local_profile(profile: str | Profile) -> Profile:
    """A profile for `up --local`: its setup and environment on the local backend, with all of
    this machine's GPUs and CPUs unless `--gpus`/`--cpus` say less."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    return prof.model_copy(update={"backend": "local", "gpus_per_node": "auto", "cpus_per_task": "auto"})


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
    native: list[str] | None = None,
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
    backend = allocator(prof.backend)
    checked = [backend.check_native(o) for o in native or []]  # (each once)
    name = paths.validate_name(name)
    walltime = durations.validate_time(time) if time else prof.time  # (the profile's: read at load)
    lead, lead_note = _signal_lead(prof, signal_lead, walltime)
    gpus, cpus, mem, note = _node_size(backend, prof, nodes, (gpus_per_node, cpus_per_task), shape)
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
        chain=_links(prof.chain if chain is None else chain),
        signal_lead=max(1, round(lead)),
        python=python or sys.executable,
        native=(*prof.extra_sbatch, *checked),
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
    backend: Allocator,
    prof: Profile,
    nodes: int,
    asked: tuple[int | None, int | None],
    shape: NodeShape | None,
) -> tuple[int, int | None, str | None, str]:
    """(GPUs, CPUs, memory, note) per node: those asked, else the profile's; counts left at "auto"
    become a whole node's (the backend's own where it decides them), checked against `shape`."""
    gpus, cpus = backend.counts(
        prof.gpus_per_node if asked[0] is None else asked[0],
        prof.cpus_per_task if asked[1] is None else asked[1],
    )
    mem, note = prof.mem, ""
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
    if shape is not None:
        within(shape, nodes, gpus, cpus)
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


def render_script(plan: AllocationPlan) -> str:
    """The allocation script of the plan's backend around raystack's environment lines."""
    return allocator(plan.backend).render(
        Script(
            request=plan.request(),
            environment=environment(plan),
            profile=plan.profile.name,
            note=plan.note,
            path=plan.script_path,
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
