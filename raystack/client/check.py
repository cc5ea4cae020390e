"""`raystack check`: a job spec validated and planned before any cluster runs.

The job is resolved exactly as `submit` resolves it (spec.resolve.prepare: the spec, its
--set overrides, its working_dir, its plan, what the cluster can never give it), against a
cluster's record or against the cluster a profile would make; nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import raystack.client.allocate as allocate
from raystack.client.cluster import Cluster, after_option
from raystack.errors import ClusterError, ConfigError, SchedulerError
from raystack.spec.job import JobSpec
from raystack.spec.profile import load_profile
from raystack.spec.resolve import Prepared, prepare_jobs
from raystack.store import cluster as records
from raystack.store import deps
from raystack.store.cluster import ClusterRecord, ClusterState


@dataclass(frozen=True)
class Target:
    """What a job is checked against: a cluster's record, or the cluster a profile would make."""

    record: ClusterRecord
    against: str  # "cluster grpo", "profile isambard (4 nodes)"
    live: bool  # a cluster's own record (its ledger names the jobs `after` may wait for)


@dataclass(frozen=True)
class Checked:
    """A job that would be queued (a sweep's first), and the cluster it was checked against (and
    how it was had)."""

    prepared: Prepared
    cluster: ClusterRecord
    against: str  # "cluster grpo", "profile isambard (4 nodes)"
    jobs: int = 1  # how many jobs it makes (a sweep's combinations), each checked


def shape(
    cluster: str | None = None,
    profile: str | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_node: int | None = None,
) -> Target:
    """The cluster to check against: a cluster's record (named, $RAYSTACK_CLUSTER or the only one)
    when no profile is given, else the cluster the profile would make on `nodes` nodes."""
    if profile is None and nodes is None and gpus_per_node is None and cpus_per_node is None:
        try:
            record = Cluster.get(cluster).snapshot()
            return Target(record, f"cluster {record.name}", live=True)
        except ClusterError:
            if cluster or records.list_names():
                raise  # (a cluster named that does not exist, or several: say which)
    if cluster:
        raise ConfigError("check: give --cluster, or --profile with --nodes, not both")
    prof = load_profile(profile or "generic")
    try:
        plan = allocate.plan_on_partition(
            nodes or 1, profile=prof, name="check", gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_node
        )
    except SchedulerError as exc:
        raise ConfigError(
            f"check: profile {prof.name} takes whole nodes, and sinfo could not say how big they are "
            f"({exc}); give --gpus-per-node and --cpus-per-node, or a profile that sets them"
        ) from None
    record = ClusterRecord(
        name="check",
        state=ClusterState.SUBMITTED,
        profile=prof.name,
        nodes_expected=plan.nodes or 1,
        gpus_per_node=plan.gpus_per_node,
        cpus_per_node=plan.cpus_per_task or 0,
        walltime=plan.walltime,
        described=f"the cluster of profile {prof.name}",
    )
    words = f"profile {prof.name} ({record.nodes_expected} node(s) of {record.gpus_per_node} GPUs)"
    return Target(record, words, live=False)


def check(
    job: str | Path | JobSpec | list[str],
    sets: list[str],
    target: Target,
    sweeps: list[str] | None = None,
    after: list[str] | None = None,
) -> Checked:
    """Resolve a job as `submit` would against the target (ConfigError when it could not run):
    every combination of its sweep (the spec's `sweep:` block and `sweeps`, as --sweep); against a
    cluster's record, its `after` ids (the spec's and `after`, as --after) must name jobs of that
    cluster, as at submit."""
    given = after_option(after)
    jobs = prepare_jobs(job, list(sets), target.record, Path.cwd(), list(sweeps or []))
    own = {one.request.id for one in jobs}
    for ids, label in ((jobs[0].request.after, "after:"), (given, "--after")):
        if target.live and (why := deps.unknown(target.record.name, ids, own, label)):
            raise ConfigError(why)
    return Checked(jobs[0], target.record, target.against, len(jobs))
