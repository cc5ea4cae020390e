"""What Ray receives for a JobRequest: the entrypoint, runtime_env (env_vars, working_dir,
excludes), resources and metadata. Pure functions; the queue runner submits the result.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raystack.launch import PIN_DIR, SECRET_NAMES_ENV, SECRETS_ENV, SUBMIT_DIR_ENV
from raystack.spec import workdir
from raystack.spec.planning import PlanSpec, occupied, substitute
from raystack.store import paths
from raystack.store.cluster import ClusterRecord
from raystack.store.ledger import JobRequest
from raystack.store.secrets import file as secrets_file

# NOTE: Ray's job supervisor gives the driver RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 (so
# that a driver without GPUs of its own still sees the node's). Frameworks that forward the
# driver's environment to their actors (open-instruct's grpo_fast.py, NeMo-RL: ray.init(
# runtime_env={"env_vars": dict(os.environ)})) pass it on, and Ray then stops masking GPUs: every
# actor sees every GPU of its node and all land on GPU 0. The driver does not need it (it is not
# a Ray worker; it keeps seeing the node's GPUs through SLURM's CUDA_VISIBLE_DEVICES), so it is
# removed before the entrypoint runs.
NOSET_VARS = (
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
)
DRIVER_PREFIX = f"unset {' '.join(NOSET_VARS)}; "


def run_dir(request: JobRequest) -> str | None:
    """The folder a job runs in when it brings no working_dir: the one it was submitted from, as
    sbatch runs a job where it was submitted (Ray would run it wherever `ray start` ran). None
    with a working_dir (Ray runs it in its copy) or for a request of a version before this."""
    return None if request.working_dir else request.submit_dir


# A job with secrets: its driver reads them from their file (store/secrets.py) before anything
# else; a file that is gone ends it at once with the reason (never a run without them).
SECRETS_PREFIX = (
    '[ -r "$RAYSTACK_SECRETS" ] || { echo "raystack: this job\'s secrets file $RAYSTACK_SECRETS is gone '
    '(removed when the job ends): submit it again" >&2; exit 1; }; . "$RAYSTACK_SECRETS"; '
)


def driver_entrypoint(entrypoint: str, folder: str | None = None, secrets: bool = False) -> str:
    """The shell command Ray runs for the driver: the user's, verbatim, after the prefix (and a
    `cd` into `folder`; where the node cannot enter it, the shell's error and where the job runs
    instead are in the job's log, as SLURM goes on in /tmp for a --chdir the node lacks)."""
    prefix = DRIVER_PREFIX + (SECRETS_PREFIX if secrets else "")
    if not folder:
        return prefix + entrypoint
    enter = f'cd -- {shlex.quote(folder)} || echo "raystack: warning: the job runs in $PWD instead" >&2; '
    return prefix + enter + entrypoint


# PyTorch's own evidence of a stuck collective (read in torch 2.11 and 2.13; older names in
# brackets, which torch still reads and which a user may have set instead):
#   TORCH_FR_BUFFER_SIZE (TORCH_NCCL_TRACE_BUFFER_SIZE)   the flight recorder: each rank keeps its
#       last N collectives, with sequence numbers and states (0: off)
#   TORCH_NCCL_DUMP_ON_TIMEOUT=1   when NCCL's watchdog times a collective out, every rank dumps it
#   TORCH_FR_DUMP_TEMP_FILE (TORCH_NCCL_DEBUG_INFO_TEMP_FILE)   ... into <prefix><rank>: the job's
#       logs/jobs/<id>/flight/rank_<r> (the queue runner makes the folder)
#   TORCH_NCCL_DEBUG_INFO_PIPE_FILE   each rank opens the named pipe <prefix><rank>.pipe; a write to
#       it dumps the recorder at once: the nodes do that for a job judged hung (node-local /tmp,
#       which exists everywhere: torch fails the process group if it cannot make the pipe)
#   TORCH_NCCL_ASYNC_ERROR_HANDLING=3   a failed or timed-out collective ends the process (torch's
#       default, said explicitly: a site's 0 would leave a rank running after an NCCL error)
#   TORCH_NCCL_ENABLE_MONITORING=1, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC   a rank whose NCCL watchdog
#       thread itself is stuck this long is ended by torch (the job's hang_timeout, at least 60 s)
FLIGHT_PREFIX = "rank_"
TORCH_ALIASES = {
    "TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
}


def torch_env(request: JobRequest, cluster: str, inherited: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The torch.distributed variables raystack sets for a job, less any the user set (in the
    spec's env, or in the environment the cluster was started with), under either name."""
    flight = paths.cluster(cluster).job_files(request.id) / "flight"
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": f"{flight}/{FLIGHT_PREFIX}",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"/tmp/raystack-fr-{request.id}-rank",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
    }
    hang = (
        request.hang_timeout
        if request.hang_timeout is not None
        else float(inherited.get("RAYSTACK_HANG_TIMEOUT") or 0)
    )
    if hang:
        env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = str(max(60, math.ceil(hang)))
    given = set(request.env) | set(inherited)
    return {k: v for k, v in env.items() if k not in given and TORCH_ALIASES.get(k) not in given}


def job_env(request: JobRequest, cluster: ClusterRecord, resumes: int = 0) -> dict[str, str]:
    """The environment conventions every job gets (documented in the README), spec env on top.

    `resumes`: how often the job was interrupted (walltime) and is now submitted again."""
    env = {
        # Frameworks call ray.init(runtime_env={"env_vars": dict(os.environ)}), which otherwise
        # fails to merge with the job's own env_vars.
        "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "1" if request.uv else "0",
        "RAYSTACK_CLUSTER": cluster.name,
        "RAYSTACK_JOB_ID": request.id,
        # Read by Ray's job supervisor: SIGTERM, then SIGKILL after this many seconds.
        "RAY_JOB_STOP_WAIT_TIME_S": str(max(1, math.ceil(request.stop_grace))),
    }
    if cluster.walltime_end:
        env["RAYSTACK_DEADLINE"] = str(int(cluster.walltime_end))
    env["RAYSTACK_CHAIN_INDEX"] = str(cluster.chain_index)
    env["RAYSTACK_CHAIN_COUNT"] = str(cluster.chain_count)
    if resumes:
        env["RAYSTACK_RESUME"] = "1"
        env["RAYSTACK_RESUME_COUNT"] = str(resumes)
    if folder := run_dir(request):  # (SPMD ranks start there too: raystack.launch.spmd)
        env[SUBMIT_DIR_ENV] = folder
    if request.secrets:  # (the file's path and the names: the values are read by the driver)
        env[SECRETS_ENV] = str(secrets_file(cluster.name, request.nonce))
        env[SECRET_NAMES_ENV] = ",".join(request.secrets)
    for key, path in request.outputs.items():
        env[f"RAYSTACK_OUTPUT_{key.upper()}"] = path
    env.update(torch_env(request, cluster.name))
    env.update(request.env)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def runtime_env(request: JobRequest, cluster: ClusterRecord, resumes: int = 0) -> dict[str, Any]:
    """The user's runtime_env (pip, py_modules, ...) with raystack's env_vars, working_dir and
    excludes: the user's env_vars are in request.env already, below raystack's own names."""
    renv: dict[str, Any] = {**request.runtime_env, "env_vars": job_env(request, cluster, resumes)}
    if request.working_dir:
        renv["working_dir"] = request.working_dir
        renv["excludes"] = request.excludes
        local = "://" not in request.working_dir and Path(request.working_dir).is_dir()
        if local and (zipped := workdir.packed(Path(request.working_dir), request.excludes)):
            renv["working_dir"] = str(zipped)  # (Ray uploads a zip as it is: no ignore file read)
            del renv["excludes"]
    return renv


def submit_options(request: JobRequest, cluster: ClusterRecord, resumes: int = 0) -> dict[str, Any]:
    """Keyword arguments of Dashboard.submit for this request (besides its submission id).

    A plan is computed again here, from the cluster as it is now. Raises ConfigError when it no
    longer fits."""
    entrypoint = request.entrypoint
    if request.plan:  # (a packed job plans on its own nodes)
        plan = PlanSpec.model_validate(request.plan)
        mine = occupied(cluster, request.needs)
        entrypoint = substitute(entrypoint, plan, mine, f"job {request.id}", request.processes)
    return {
        "entrypoint": driver_entrypoint(entrypoint, run_dir(request), bool(request.secrets)),
        "runtime_env": runtime_env(request, cluster, resumes),
        "entrypoint_num_cpus": request.entrypoint_num_cpus or None,
        "entrypoint_num_gpus": request.entrypoint_num_gpus or None,
        "entrypoint_resources": request.entrypoint_resources or None,
        "entrypoint_memory": request.entrypoint_memory or None,
        "metadata": {
            **request.metadata,
            "job_name": request.name,  # the dashboard's Name column
            "raystack_job": request.id,
            "raystack_name": request.name,
            "raystack_cluster": cluster.name,
            "raystack_nonce": request.nonce,
        },
    }


def pinned(options: dict[str, Any], nodes: list[str], node_ids: list[str]) -> dict[str, Any]:
    """A packed job's submission: its driver on its first node (Ray's `node:<ip>` resource), and
    every process of it with the hook that keeps its tasks, actors and placement groups on its
    nodes (launch/pinned/sitecustomize.py); RAYSTACK_NODES tells the job where it runs."""
    renv = dict(options["runtime_env"])
    env = dict(renv["env_vars"])
    env["RAYSTACK_PIN_NODES"] = ",".join(i for i in node_ids if i)
    env["RAYSTACK_NODES"] = ",".join(nodes)
    env["PYTHONPATH"] = f"{PIN_DIR}:{env.get('PYTHONPATH', '${PYTHONPATH}')}"
    renv["env_vars"] = env
    resources = {**(options.get("entrypoint_resources") or {}), f"node:{nodes[0]}": 0.001}
    return {**options, "runtime_env": renv, "entrypoint_resources": resources}
