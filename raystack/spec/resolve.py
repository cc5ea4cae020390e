"""Resolve a validated spec against the submitter's filesystem and the cluster into a JobRequest.

Nothing is written here: the working_dir must exist and fit Ray's upload limit, outputs become
absolute paths on the shared filesystem, and `needs` must fit the cluster.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import logging
import math
import secrets
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raystack import durations
from raystack.adapters.allocator import allocator, asked
from raystack.durations import duration_text
from raystack.errors import ConfigError
from raystack.plan.topology import plural
from raystack.spec import rayenv, runtime_env
from raystack.spec.job import MAX_SWEEP, JobSpec, apply_sets
from raystack.spec.load import command_spec, load_spec, validate
from raystack.spec.planning import grown_for, occupied, substitute
from raystack.spec.runtime_env import expand
from raystack.spec.values import quote
from raystack.spec.workdir import DEFAULT_EXCLUDES
from raystack.store.cluster import ClusterRecord
from raystack.store.ledger import JobRequest
from raystack.store.secrets import looks_secret

log = logging.getLogger("raystack")


def new_job_id(name: str) -> str:
    """name-<32 random bits>; the ledger is created with O_EXCL, so a repeat gets a new id."""
    return f"{name[:40]}-{secrets.token_hex(4)}"


def spmd_processes(spec: JobSpec, cluster: ClusterRecord) -> int | None:
    """An SPMD job's processes in all on this cluster (its defaults: every node, every GPU)."""
    if spec.kind != "spmd":
        return None
    nodes, gpus_per_node, _ = cluster.held
    return (spec.nodes or nodes) * (spec.procs_per_node or gpus_per_node or 1)


def layout(
    spec: JobSpec, cluster: ClusterRecord, needs: dict[str, Any], source: str
) -> tuple[str | None, int | None]:
    """A job's entrypoint with its {plan.*} filled, and an SPMD job's processes, on the nodes it
    occupies (`needs`: a packed job plans on its own nodes); (None, None) for a Ray job without
    a plan."""
    if spec.plan is None and spec.kind != "spmd":
        return None, None
    mine = occupied(cluster, needs)
    processes = spmd_processes(spec, mine)
    planned = substitute(spec.entrypoint, spec.plan, mine, source, processes) if spec.plan else None
    return planned, processes


def check_needs(spec: JobSpec, cluster: ClusterRecord, source: str) -> None:
    """Refuse, before queueing, a job that cannot fit the cluster (a bundle that does not fit hangs)."""
    # (a cluster that grows for its queue, `up --max-nodes`, holds up to max_nodes)
    nodes, gpn, cpn = cluster.held
    local = not allocator(cluster.backend).remote  # (one machine: it never grows)
    nodes = nodes if local else max(nodes, cluster.max_nodes or 0)
    n = spec.needs

    def refused(asked: str, total: str = "") -> ConfigError:
        have = f"{cluster.title} has {plural(nodes, 'node')} x {plural(gpn, 'GPU')}{total}"
        fix = "lower it, or start a larger cluster with raystack up"
        if local:
            have += " (a --local cluster is this one machine)"
            fix = "lower it, or run it on a SLURM cluster (raystack up --nodes N)"
        return ConfigError(f"{source}: {asked} but {have}; {fix}")

    if n.nodes is not None and n.nodes > nodes:
        raise refused(f"needs.nodes={n.nodes}")
    if n.cpus is not None and cpn and n.cpus > nodes * cpn:
        raise refused(f"needs.cpus={n.cpus}", f" x {cpn} CPUs = {nodes * cpn}")
    if n.gpus is not None and n.gpus > nodes * gpn:
        raise refused(f"needs.gpus={n.gpus}", f" = {nodes * gpn}")
    if n.gpus_per_node is not None and n.gpus_per_node > gpn:
        raise refused(f"needs.gpus_per_node={n.gpus_per_node}")
    if n.cpus_per_gpu is not None and cpn:
        per_node = n.cpus_per_gpu * (n.gpus_per_node or gpn)
        if per_node > cpn:
            raise ConfigError(
                f"{source}: needs.cpus_per_gpu={n.cpus_per_gpu:g} asks {per_node:g} CPUs per node "
                f"but {cluster.title} has {cpn}; lower it or raise cpus_per_task"
            )
    if spec.kind == "spmd" and spec.nodes and spec.nodes > nodes:
        raise refused(f"nodes={spec.nodes}")
    if spec.kind == "spmd" and spec.procs_per_node and gpn and spec.procs_per_node > gpn:
        raise refused(f"procs_per_node={spec.procs_per_node}")
    check_time_and_resources(spec, cluster, source)
    check_driver(spec, cluster, source)


def check_driver(spec: JobSpec, cluster: ClusterRecord, source: str) -> None:
    """Refuse a driver that asks more than one node of the cluster gives (it runs on one node)."""
    _, gpn, cpn = cluster.held
    if spec.entrypoint_num_gpus > gpn:  # (the driver is one process: on one node)
        raise ConfigError(
            f"{source}: entrypoint_num_gpus={spec.entrypoint_num_gpus:g} but the driver runs on one node "
            f"and {cluster.title} has {gpn} GPUs per node; lower it (its actors take the others)"
        )
    if cpn and spec.entrypoint_num_cpus > cpn:
        raise ConfigError(
            f"{source}: entrypoint_num_cpus={spec.entrypoint_num_cpus:g} but nodes have {cpn} CPUs"
        )
    memory = cluster.memory_per_node
    if memory and spec.entrypoint_memory > memory:
        raise ConfigError(
            f"{source}: entrypoint_memory={spec.entrypoint_memory / 2**30:.1f} GiB but a node of "
            f"{cluster.title} gives Ray {memory / 2**30:.1f} GiB (its memory resource); lower it"
        )


# The resources Ray's nodes in a raystack cluster have (none are added by raystack), besides the
# per-node `node:<ip>` and detected `accelerator_type:<kind>` ones.
RAY_RESOURCES = ("memory", "object_store_memory")
RESOURCE_FIELDS = {"CPU": "entrypoint_num_cpus", "GPU": "entrypoint_num_gpus"}


def check_time_and_resources(spec: JobSpec, cluster: ClusterRecord, source: str) -> None:
    """Refuse a job that could never start on this cluster: a min_time longer than its allocations
    last, or an entrypoint resource no node has (Ray would keep it PENDING forever)."""
    walltime = cluster_walltime(cluster)
    if spec.min_time and walltime and spec.min_time > walltime:
        raise ConfigError(
            f"{source}: min_time {duration_text(spec.min_time)} but {cluster.title} gets "
            f"{duration_text(walltime)} per allocation: it would never start; lower min_time, or "
            f"raystack up -t {duration_text(spec.min_time + 3600)} ..."
        )
    for key in spec.entrypoint_resources:
        if key in RESOURCE_FIELDS:
            raise ConfigError(
                f"{source}: entrypoint_resources: {key} has its own field: {RESOURCE_FIELDS[key]}: N"
            )
        if key not in RAY_RESOURCES and not key.startswith(("node:", "accelerator_type:")):
            raise ConfigError(
                f"{source}: entrypoint_resources: no node of {cluster.title} has a resource "
                f"'{key}' (Ray's nodes have CPU, GPU, memory, object_store_memory): the driver would "
                "never start; drop it"
            )


def cluster_walltime(cluster: ClusterRecord) -> float | None:
    """Seconds each allocation of the cluster is given (the record's, or its request's time)."""
    if cluster.walltime:
        return cluster.walltime
    request = asked(cluster)
    times = [o.removeprefix("--time=") for o in request.native if o.startswith("--time=")] if request else []
    for given in ([request.time] if request and request.time else []) + times:
        with contextlib.suppress(ValueError):
            return float(durations.duration(given))
    return None


def check_ray(
    spec: JobSpec, cluster: ClusterRecord, joined: runtime_env.Resolved, submit_dir: Path | None, source: str
) -> None:
    """The job's own Python environment has the cluster's Ray (spec/rayenv.py), or ConfigError."""
    local = joined.working_dir if joined.working_dir and "://" not in joined.working_dir else None
    folder = Path(local) if local else submit_dir  # (where `uv run` finds the project)
    version = cluster.ray_version or rayenv.installed()
    why = rayenv.submit_fault(joined.runtime_env, spec.entrypoint, spec.uv, folder, version)
    if why:
        raise ConfigError(f"{source}: {why}")


def warn_of_secrets(env: dict[str, str], secrets: list[str], source: str) -> None:
    """A warning for each env value that looks like a secret and is not given as one."""
    for key in looks_secret(env):
        if key not in secrets:
            log.warning(
                "raystack: warning: %s: env.%s looks like a secret: its value goes into the ledger and "
                "Ray's runtime_env; give it as secrets: [%s] (taken from your environment at submit, "
                "never written down) or `submit --secret %s`",
                *(source, key, key, key),
            )


AS_GIVEN = (  # the fields a request takes from its spec as they are
    "entrypoint_memory", "entrypoint_num_cpus", "entrypoint_num_gpus", "timeout", "retries", "retry_window",
    "hang_timeout", "hang_action", "infeasible_grace", "stop_grace", "uv", "min_time",
)  # fmt: skip


def resolve(
    spec: JobSpec,
    cluster: ClusterRecord,
    base_dir: Path,
    source: str,
    spec_file: str | None = None,
    job_id: str | None = None,
    submit_dir: Path | None = None,
) -> JobRequest:
    """Check and resolve a spec for a cluster; nothing is written. `submit_dir`: the folder the
    job was submitted from (it runs there unless it has a working_dir)."""
    check_needs(spec, cluster, source)
    needs = declared_needs(spec, cluster)
    planned, processes = layout(spec, cluster, needs, source)
    excludes = [*DEFAULT_EXCLUDES, *spec.excludes]
    joined = runtime_env.resolve(
        spec.working_dir, excludes, dict(spec.env), spec.runtime_env, base_dir, source
    )
    check_ray(spec, cluster, joined, submit_dir, source)
    outputs = {key: str((base_dir / expand(path)).resolve()) for key, path in spec.outputs.items()}
    warn_of_secrets(joined.env, spec.secrets, source)
    return JobRequest(
        id=job_id or new_job_id(spec.name),
        name=spec.name,
        cluster=cluster.name,
        entrypoint=spec.entrypoint,
        **{key: getattr(spec, key) for key in AS_GIVEN},
        working_dir=joined.working_dir,
        excludes=joined.excludes,
        left_out=joined.left_out,
        env=joined.env,
        runtime_env=joined.runtime_env,
        metadata=dict(spec.metadata),
        entrypoint_resources=dict(spec.entrypoint_resources),
        outputs=outputs,
        after=list(spec.after),
        needs=needs,
        plan=spec.plan.model_dump() if spec.plan else None,
        planned=planned,
        processes=processes,
        secrets=list(spec.secrets),
        spec_file=spec_file,
        submit_dir=str(submit_dir) if submit_dir else None,
    )


def declared_needs(spec: JobSpec, cluster: ClusterRecord) -> dict[str, Any]:
    """What the job occupies, as the queue packs and grows the cluster for it: its `needs`; an
    SPMD job's `nodes` (its ranks take whole nodes) where needs.nodes is not given; a GRPO plan's
    nodes where its learners and engines do not fit the cluster as it is but fit it grown."""
    needs = spec.needs.model_dump(exclude_none=True)
    if spec.kind == "spmd" and spec.nodes and "nodes" not in needs:
        needs["nodes"] = spec.nodes
    if spec.plan is not None and not needs and (nodes := grown_for(spec.plan, cluster)):
        needs["nodes"] = nodes
    return needs


def resumed_spec(spec: JobSpec, source: str) -> JobSpec | None:
    """The spec an interrupted job resumes with: its `resume.set` overrides applied and
    `resume.env` added; None when it has none (it resumes as it was)."""
    if not spec.resume.set and not spec.resume.env:
        return None
    data = spec.model_dump(exclude={"resume", *({"entrypoint"} if spec.kind == "spmd" else set())})
    for item in spec.resume.set:  # (named as the spec's resume.set, not as --set)
        data = apply_sets(data, [item], given_as=f"{source}: field 'resume.set': {quote(item)}")
    data["env"] = {**data.get("env", {}), **spec.resume.env}
    return validate(data, f"{source} (resume)")


@dataclass(frozen=True)
class Prepared:
    """A job ready to queue: the request, and the one it resumes with (its `resume:` block)."""

    request: JobRequest
    resume: JobRequest | None
    spec: JobSpec


def prepare(
    job: str | Path | JobSpec | list[str],
    sets: list[str],
    cluster: ClusterRecord,
    cwd: Path,
    job_id: str | None = None,
) -> Prepared:
    """Load (a spec file, a command argv or a JobSpec), validate and resolve a job for a cluster:
    what `submit` queues and `check` shows. Nothing is written. Raises ConfigError."""
    if isinstance(job, list):
        spec, base, source, file = command_spec(job, sets), cwd, "command", None
    elif isinstance(job, str | Path):
        path = Path(job)
        spec, base = load_spec(path, sets), (cwd / path).resolve().parent
        source, file = f"job spec {path}", str((cwd / path).resolve())
    else:
        spec, base, source, file = job, cwd, f"job spec {job.name}", None
    request = resolve(spec, cluster, base, source, file, job_id, cwd)
    resumed = resumed_spec(spec, source)
    again = resolve(resumed, cluster, base, f"{source} (resume)", file, request.id, cwd) if resumed else None
    return Prepared(request, again, spec)


def prepare_jobs(
    job: str | Path | JobSpec | list[str],
    sets: list[str],
    cluster: ClusterRecord,
    cwd: Path,
    sweeps: list[str] | None = None,
    job_id: str | None = None,
) -> list[Prepared]:
    """The job, or one job per combination of its sweep (the spec's `sweep:` block and `--sweep
    KEY=V1,V2`), each resolved as `prepare` does: one sweep id, job ids <name>-<sweep>-<k>."""
    first = prepare(job, sets, cluster, cwd, job_id)
    axes = {**first.spec.sweep, **dict(parse_sweep(item) for item in sweeps or [])}
    if not axes:
        return [first]
    for key, given in axes.items():  # (allowed: replicas of one setting; said, as it may be a typo)
        if twice := [v for v, n in Counter(str(v) for v in given).items() if n > 1]:
            log.warning(
                "raystack: warning: sweep %s: %r is given more than once: those jobs run alike", key, twice[0]
            )
    if job_id:
        raise ConfigError(f"--submission-id {job_id}: names one job, and a sweep makes several; drop it")
    if math.prod(len(v) for v in axes.values()) > MAX_SWEEP:
        raise ConfigError(f"--sweep: more than {MAX_SWEEP} combinations; split the sweep")
    sweep_id = f"{first.spec.name[:40]}-{secrets.token_hex(3)}"
    out = []
    for k, combo in enumerate(itertools.product(*axes.values()), start=1):
        values = dict(zip(axes, (str(v) for v in combo), strict=True))
        one = prepare(
            job, [*sets, *(f"{key}={v}" for key, v in values.items())], cluster, cwd, f"{sweep_id}-{k}"
        )
        for request in (one.request, one.resume):
            if request is not None:
                request.sweep, request.sweep_values = sweep_id, values
        out.append(one)
    return out


def parse_sweep(item: str) -> tuple[str, list[str]]:
    """--sweep KEY=V1,V2,... (or KEY=[V1, V2]; "V,1" for a value with a comma): the key and its
    values as text."""
    key, eq, values = item.partition("=")
    if not eq or not key.strip() or not values.strip():
        raise ConfigError(f"--sweep {item!r}: give KEY=V1,V2,..., e.g. --sweep env.LR=1e-6,3e-6")
    text = values.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    # (a value holding a comma is double-quoted: "--a 1,--b 2",x; as a CSV field)
    try:
        row = next(csv.reader([text], skipinitialspace=True, strict=True), [])
    except csv.Error:
        raise ConfigError(
            f'--sweep {item!r}: a quote (") is not closed; a value holding a comma is written "V,1"'
        ) from None
    found = [v.strip() for v in row if v.strip()]
    if not found:
        raise ConfigError(f"--sweep {item!r}: no values; e.g. --sweep env.LR=1e-6,3e-6")
    # (a key that is no field of the spec: named now)
    apply_sets({}, [f"{key.strip()}={found[0]}"], given_as=f"--sweep {item!r}")
    return key.strip(), found
