"""Launch ahead: an SPMD job's launchers start as the job is submitted, not once its driver runs.

Through the Ray Jobs API a driver runs 1.5-4.5 s after its submit (Ray's job supervisor, the
driver's python and `import ray`); a `kind: spmd` job's launchers used to start only then. So the
queue runner, right after it submitted such a job, asks the head's launch host (pool.py) to start
it: a file named after the submission id in `spmd-ahead/` of the head's node-local temp folder and
a byte down the host's pipe beside it (store/files.py: poke). The host reads the job as Ray holds
it (its entrypoint and runtime_env, with the working_dir package the submit uploaded), places it
as the driver would (a STRICT_SPREAD placement group of one bundle per node, detached and named
`raystack-spmd-<submission id>`) and starts every node's launcher on the nodes' hosts. The driver,
once it runs, adopts them (`adopt`): it prints, follows and stops them as its own, and removes the
placement group when it is done (`release`).

Only a job whose launchers would run on the launch hosts anyway is started ahead (pool.unfit: whole
nodes, nothing in its runtime_env that Ray's agent makes), without secrets (its driver reads them)
and not packed on nodes of its own. Whatever the driver does not adopt is the host's to end: the
host reads the job's status in Ray every WATCH seconds and, once the job ended (stopped before
its driver ran, a driver that failed to start or was killed) or ADOPT seconds passed without a
driver, stops the launches and removes the placement group (that side: pool.py, `Ahead`).
`RAYSTACK_SPMD_AHEAD=0` where the cluster runs turns it off (the driver then starts its launchers
itself, as before).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

from raystack.launch import NODE_TMP_ENV, SECRET_NAMES_ENV, pool

log = logging.getLogger("raystack.spmd")

OFF_ENV = "RAYSTACK_SPMD_AHEAD"


def off(env: dict[str, str] | os._Environ[str]) -> bool:
    return env.get(OFF_ENV, "1") == "0" or pool.off(env)


def valid(sid: str) -> bool:
    return bool(sid) and "/" not in sid and not sid.startswith(".") and len(sid) < 200


# ---------------------------------------------------------------------- the queue runner's side
def ask(sid: str, entrypoint: str, options: dict[str, Any], node_tmp: str | None = None) -> bool:
    """After the submit of job `sid`: ask the head's host to start its launchers now (True where
    a host listens). Nothing is asked for a job that is not an SPMD driver, is packed, sets its
    driver's resources (it may run on another node) or has secrets."""
    node_tmp = node_tmp or os.environ.get(NODE_TMP_ENV)
    env = (options.get("runtime_env") or {}).get("env_vars") or {}
    if not node_tmp or off(os.environ) or off(env) or not valid(sid) or pool.DRIVER not in entrypoint:
        return False
    if env.get(pool.PINNED) or env.get(SECRET_NAMES_ENV):
        return False
    if any(options.get(k) for k in ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_resources")):
        return False
    from raystack.store.files import poke

    folder = os.path.join(node_tmp, pool.REQUESTS)
    request = os.path.join(folder, sid)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.close(os.open(request, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:
        return False
    if poke(os.path.join(node_tmp, pool.WAKE)):
        return True
    with contextlib.suppress(OSError):  # (no host listens: the driver starts them, as before)
        os.unlink(request)
    return False


# ---------------------------------------------------------------------- the driver's side
def submission_id() -> str | None:
    """The driver's own submission id (Ray gives the driver its job's metadata)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
        sid = (config.get("metadata") or {}).get("job_submission_id")
        return str(sid) if sid else None
    return None


_taken: dict[str, Any] = {}  # submission id -> the host it was adopted from


def adopt(sid: str | None) -> tuple[list, list[dict], str, list[str], tuple] | None:
    """The launches started ahead for this driver's job, taken over (None: none were started,
    or they could not be; the driver starts its own)."""
    import ray

    if not sid or off(os.environ):
        return None
    here = ray.get_runtime_context().get_node_id()
    host = pool.find([here]).get(here)
    if host is None:
        return None
    try:
        got = ray.get(host.adopt.remote(sid), timeout=pool.ADOPT + 30)
    except Exception as exc:  # (a host from before this module: the driver starts its own)
        log.warning("the launches started ahead were not adopted: %s", exc)
        return None
    if not got:
        return None
    _taken[sid] = host
    actors = [pool.Pooled(h, k) for h, k in zip(got["hosts"], got["keys"], strict=True)]
    return actors, got["places"], got["how"], got["commands"], tuple(got["fits"])


def release(sid: str | None) -> bool:
    """The driver is done with launches it adopted: closed and their placement group removed now
    (the host would within pool.WATCH seconds). False where it adopted none."""
    import ray

    host = _taken.pop(sid or "", None)
    if host is None:
        return False
    with contextlib.suppress(Exception):
        ray.get(host.release.remote(sid), timeout=30)
    return True
