"""The next job's environment, made ready while the job before it runs.

Ray sets a job's environment up after the job is submitted: the submitting client packages and
uploads its working_dir and py_modules, then each node's runtime_env agent downloads them and
creates what the runtime_env asks for (a pip or uv virtualenv, a conda env, an image) the first
time a process of the job lands there. A pip environment takes seconds to minutes. In a queue all
of that is dead time between two jobs. So while a job runs, the queue runner prepares the one
that waits first:

1. its working_dir and py_modules are uploaded through Ray's job SDK, as its submit would upload
   them: the package's name is the hash of its content, so the submit finds it there and uploads
   nothing (a file changed since: a new hash, uploaded then, the job runs what is there at start);
2. a throwaway job (`raystack-prepare-<id>`) with the same runtime_env runs one zero-CPU task on
   every alive node: each node's runtime_env agent creates the environment and keeps it in its
   URI cache (10 GB per kind by default), so the real job's start finds it there. Its driver and
   tasks ask for no CPU or GPU: nothing is taken from the running job (a Ray worker starts on
   each node for a moment). It is deleted from Ray's list once it ended.

A job whose runtime_env has nothing to create (only env_vars) is not prepared. What happened is
the queued job's `prepared` field ("pip, working_dir on 4 nodes in 12.3s", or why not).
"""

from __future__ import annotations

import logging
import secrets
import shlex
import threading
import time
from typing import Any

from raystack.adapters.ray import ray_state
from raystack.allocation.runner import pipcheck
from raystack.errors import ClusterError, ConfigError, RaystackError
from raystack.spec.submission import submit_options
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.files import locked
from raystack.store.ledger import JobState, change_job, read_job
from raystack.waiting import REAL, Clock, poll_until, retry

log = logging.getLogger("raystack.runner")

PREFIX = "raystack-prepare-"
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
# What a runtime_env may hold that Ray creates on each node (env_vars, config: nothing to make).
CREATED = ("working_dir", "py_modules", "pip", "uv", "conda", "image_uri", "container")
TIMEOUT = 1800.0  # seconds a preparation may take (a large pip environment on a slow filesystem)
DELETE_AFTER = 3.0  # seconds after its end before the throwaway job is deleted from Ray's list
# The throwaway job's driver: one zero-CPU task pinned to each alive node, so that every node's
# runtime_env agent creates the environment (Ray creates it where a process of the job lands).
# In an environment Ray made (pip, uv, conda: a folder under its runtime_resources), the task also
# byte-compiles what a Ray worker there has imported and what the job's supervisor imports, where
# no .pyc is beside it: started from a virtualenv, Ray makes a pip environment by copying that
# virtualenv without its .pyc files, and under PYTHONDONTWRITEBYTECODE=1 every process of the job
# (its supervisor first) then compiles Ray and its dependencies again, 0.4-0.6 s of a 2-core node.
TOUCH = """
import importlib, importlib.util, os, py_compile, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On

def warm():
    if os.sep + 'runtime_resources' + os.sep not in sys.prefix + os.sep:
        return 0
    try:
        importlib.import_module('ray.dashboard.modules.job.job_supervisor')
    except Exception:
        pass
    made = 0
    for module in list(sys.modules.values()):
        source = getattr(module, '__file__', None) or ''
        if not (source.endswith('.py') and source.startswith(sys.prefix + os.sep)):
            continue
        cached = importlib.util.cache_from_source(source)
        if not os.path.exists(cached):
            try:
                py_compile.compile(source, cfile=cached, doraise=True)
                made += 1
            except Exception:
                pass
    return made

ray.init()
here = ray.remote(num_cpus=0)(warm)
ids = [n['NodeID'] for n in ray.nodes() if n['Alive']]
made = ray.get([here.options(scheduling_strategy=On(i, soft=False)).remote() for i in ids])
print('PREPARED', len(ids), sum(made))
"""


def wanted(runtime_env: dict[str, Any]) -> list[str]:
    """What of this runtime_env Ray creates on the nodes (empty: nothing to prepare)."""
    return [key for key in CREATED if runtime_env.get(key)]


def forget(dashboard: Any, submission_id: str, clock: Clock = REAL, after: float = DELETE_AFTER) -> None:
    """Delete an ended throwaway job from Ray's list once Ray's job manager stopped watching it:
    deleted at once, its monitor finds the supervisor gone and writes the job back as FAILED."""

    def deleted(_attempt: int) -> bool | None:
        if dashboard.info(submission_id) is None:
            return True
        dashboard.jobs.delete_job(submission_id)
        return None

    clock.sleep(after)
    retry(deleted, 3, after, clock)


class Preparer:
    """Prepares one queued job at a time, on a thread of its own; the runner gives it the job
    that waits first (`consider`), which returns at once."""

    def __init__(self, cluster: str, api: Any, clock: Clock = REAL, timeout: float = TIMEOUT):
        self.cluster, self.api, self.clock, self.timeout = cluster, api, clock, timeout
        self.seen: set[str] = set()  # (job id, its nonce and interruptions): prepared or tried
        self.thread: threading.Thread | None = None
        self.checked: set[str] = set()  # runtime_envs whose packages pipcheck found (pipcheck.key)
        self.holding: str | None = None  # the job whose preparation runs while it still waits

    def busy(self) -> bool:
        """A preparation runs for a job that still waits (one whose job started meanwhile goes on
        making its environment on the other nodes, and the next job may be prepared beside it)."""
        return self.thread is not None and self.thread.is_alive() and self.holding is not None

    def start(self, job_id: str) -> None:
        """Job `job_id` is being submitted: its preparation, if any runs, no longer holds the next."""
        if job_id == self.holding:
            self.holding = None

    def ahead(self, job_id: str, key: str, runtime_env: dict[str, Any]) -> bool:
        """Prepare job `job_id` (once per `key`) unless a preparation runs; whether one started."""
        if key in self.seen or self.busy() or not hasattr(self.api, "jobs"):
            return False
        self.seen.add(key)
        what = wanted(runtime_env)
        if not what:
            return False
        self.holding = job_id
        self.thread = threading.Thread(
            target=self.prepare, args=(job_id, dict(runtime_env), what), name=f"prepare-{job_id}", daemon=True
        )
        self.thread.start()
        return True

    def consider(self, job_id: str) -> bool:
        """Prepare queued job `job_id` with the runtime_env its submit would give now (its plan
        resolved on the cluster as it is); a job that no longer fits is left to its submit."""
        try:
            record = read_job(self.cluster, job_id)
            request = (record.resume_request or record.request) if record.interruptions else record.request
            renv = submit_options(request, records.read(self.cluster), record.interruptions)["runtime_env"]
        except (ClusterError, ConfigError, OSError):
            return False
        if record.state is not JobState.QUEUED:
            return False
        return self.ahead(record.id, key_of(record.id, request.nonce, record.interruptions), renv)

    def prepare(self, job_id: str, runtime_env: dict[str, Any], what: list[str]) -> str:
        """Upload, then create on every node; the outcome, also in the job's ledger."""
        t0 = time.monotonic()
        sid = f"{PREFIX}{job_id}-{secrets.token_hex(3)}"
        try:
            if why := pipcheck.check(runtime_env):  # (its submit fails it with that reason)
                raise ValueError(why)
            self.checked.add(pipcheck.key(runtime_env))
            self.api.upload(runtime_env)  # (the SDK's own, as its submit)
            touch = f"python -c {shlex.quote(TOUCH)}"
            self.api.submit(sid, touch, runtime_env, metadata={"raystack_prepare": job_id})
            info = poll_until(lambda: self.ended(sid), self.timeout, "the preparation", self.clock)
            took = time.monotonic() - t0
            if ray_state(info) == "SUCCEEDED":
                nodes = next((w for line in self.api.logs(sid).splitlines() if line.startswith("PREPARED ")
                              for w in line.split()[1:2]), "?")  # fmt: skip
                outcome = f"{', '.join(what)} ready on {nodes} node(s) in {took:.1f}s"
            else:
                outcome = (
                    f"{', '.join(what)} not prepared ({ray_state(info)}: {str(info.message or '')[:300]})"
                )
            forget(self.api, sid, self.clock)
        except Exception as exc:  # (a preparation is a head start, never a failure of anything)
            outcome = f"{', '.join(what)} not prepared: {str(exc)[:300] or type(exc).__name__}"
        log.info("job %s: %s", job_id, outcome)
        self.note(job_id, outcome)
        return outcome

    def ended(self, sid: str) -> Any:
        info = self.api.info(sid)
        return info if info is not None and ray_state(info) in ENDED else None

    def note(self, job_id: str, outcome: str) -> None:
        """The outcome in the job's ledger (its own field: the job may have started meanwhile,
        its environment ready on the head before the other nodes were)."""
        try:
            with locked(paths.cluster(self.cluster)):
                change_job(self.cluster, job_id, prepared=outcome)
        except (RaystackError, OSError) as exc:
            log.warning("job %s: preparation not recorded: %s", job_id, exc)


def key_of(job_id: str, nonce: str, interruptions: int) -> str:
    return f"{job_id}/{nonce}/{interruptions}"
