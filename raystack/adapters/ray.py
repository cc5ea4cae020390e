"""The one adapter to a cluster's Ray dashboard (Jobs API, State API) and GCS.

`Dashboard(url, token)` is the only client: Ray's own SDK clients underneath
(JobSubmissionClient, StateApiClient), the token as an explicit `Authorization: Bearer` header
(which Ray's clients prefer over the process-wide token cache, so one process can talk to
several clusters with different tokens), one timeout, and Ray's error texts matched here only.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.job_submission import JobDetails

    from raystack.store.cluster import ClusterRecord

from raystack.adapters.raywords import DEATHS, STATUS, actor_place, death_context, task_error
from raystack.errors import AlreadyExists, AuthRejected, ClusterError, NotFound, RayApiError, RayUnreachable

TIMEOUT = 10  # seconds for one State API call
# Each node's SPMD launch host (launch/pool.py) is the detached actor of this name + the node's id.
LAUNCH_HOSTS = "raystack-launch-"


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def short(exc: BaseException) -> str:
    """One line for an exception from Ray's clients (their messages span many lines)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def translate(exc: BaseException) -> RayApiError:
    """What Ray's SDK raised (a RuntimeError carrying the HTTP status and body, requests' own
    errors) as the typed error callers act on: the one place Ray's texts are read."""
    import requests

    if isinstance(exc, RayApiError):
        return exc
    text = str(exc)
    # The status code where Ray's SDK writes it, never a number found elsewhere in the text: a job
    # id holds hex digits (flaky-401281ad's 404 was once taken for a refused token, and the
    # runner retried its pass for ever).
    status = STATUS.match(text)
    code = int(status.group(1)) if status else None
    kind: type[RayApiError] = RayApiError
    if isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionError | TimeoutError):
        kind = RayUnreachable
    elif refused_token(exc, text, code):
        kind = AuthRejected
    elif "already exists" in text and code in (None, 400, 409):
        kind = AlreadyExists
    elif code == 404 or (code is None and "does not exist" in text):
        kind = NotFound
    return kind(text)


def refused_token(exc: BaseException, text: str, code: int | None) -> bool:
    """Ray's refusal of the token: its AuthenticationError, a 401 or 403, or (with no status
    code) its "Unauthorized"."""
    if type(exc).__name__ == "AuthenticationError" or code in (401, 403):
        return True
    return code is None and "Unauthorized" in text


@dataclass(frozen=True)
class NodeSummary:
    """One Ray node as the State API reports it (alive, or dead since `ended`, epoch seconds)."""

    node_id: str
    ip: str
    is_head: bool
    resources: dict[str, float]
    ended: float = 0.0


class Dashboard:
    """A cluster's dashboard, authenticated with its token."""

    def __init__(self, url: str, token: str, verify: str | bool = True):
        self.url = url
        self.token = token
        self.verify = verify  # a CA file for an https:// dashboard (a TLS cluster's own CA)

    @classmethod
    def of(cls, cluster: str, url: str) -> Dashboard:
        """The dashboard of a cluster at `url`, with its token (and its CA when https://)."""
        from raystack.store import cluster as records
        from raystack.store import tls

        verify = str(tls.ca_cert(cluster)) if url.startswith("https://") else True
        return cls(url, records.read_token(cluster), verify)

    @classmethod
    def on_head(cls, record: ClusterRecord) -> Dashboard:
        """A cluster's dashboard as its head node reaches it; refused before it has one."""
        if not record.on_head_dashboard_url:
            raise ClusterError(f"cluster {record.name} has no dashboard yet")
        return cls.of(record.name, record.on_head_dashboard_url)

    @functools.cached_property
    def jobs(self) -> Any:
        """Ray's JobSubmissionClient (created on first use: it asks the dashboard for its version)."""
        from ray.job_submission import JobSubmissionClient

        try:
            return JobSubmissionClient(self.url, headers=auth_headers(self.token), verify=self.verify)
        except Exception as exc:
            kind = type(translate(exc))
            raise kind(f"Jobs API at {self.url} did not answer: {self._why(exc)}") from exc

    def _why(self, exc: BaseException) -> str:
        if isinstance(translate(exc), AuthRejected):
            return "401 from the Jobs API: the token was refused (is it this cluster's token file?)"
        return short(exc)

    # ------------------------------------------------------------------ readiness
    def probe(self) -> str | None:
        """None when the Jobs API accepts an authenticated request, else why it did not."""
        try:
            self.jobs.list_jobs()
            return None
        except RayApiError as exc:
            return str(exc)
        except Exception as exc:
            return f"Jobs API at {self.url}: {self._why(exc)}"

    def upload(self, runtime_env: dict[str, Any]) -> None:
        """Package and upload a runtime_env's working_dir and py_modules the way the SDK's submit
        does (its own functions), rewriting them to the gcs:// URIs it names by content."""
        self.jobs._upload_working_dir_if_needed(runtime_env)
        self.jobs._upload_py_modules_if_needed(runtime_env)

    def warm(self) -> bool:
        """Pay this process's first submit before it is needed: the SDK's runtime_env validation
        and packaging modules and the connection (a fresh process's first submit took 0.9-1.3 s,
        the next ones 0.01-0.03 s, on an H100 machine). Nothing is submitted. Whether it worked
        (not while the Jobs API does not answer yet)."""
        from ray.runtime_env import RuntimeEnv

        renv: dict[str, Any] = {"env_vars": {"RAYSTACK_WARM": "1"}}
        try:
            self.upload(renv)
            RuntimeEnv(**renv).to_dict()
        except (RayApiError, RuntimeError, OSError, ValueError):
            return False
        return self.probe() is None

    def alive_nodes(self, timeout: int = TIMEOUT) -> list[NodeSummary]:
        """Alive nodes with their total resources (one cluster-wide query), one per address: a
        worker whose `ray start` is retried may leave its last try's raylet listed as alive for
        the seconds until the GCS's health check finds it gone, and it must not count twice."""
        from ray.util.state.common import NodeState

        nodes = self._state_list("nodes", [("state", "=", "ALIVE")], detail=True, timeout=timeout)
        by_ip: dict[str, NodeSummary] = {}
        for n in nodes:
            if isinstance(n, NodeState) and (n.node_ip not in by_ip or n.is_head_node):
                by_ip[n.node_ip] = NodeSummary(
                    node_id=n.node_id,
                    ip=n.node_ip,
                    is_head=bool(n.is_head_node),
                    resources=dict(n.resources_total or {}),
                )
        return list(by_ip.values())

    def _state_list(
        self,
        resource: str,
        filters: list[tuple[str, str, str]],
        detail: bool = False,
        timeout: int = TIMEOUT,
        limit: int | None = None,
    ) -> list[Any]:
        from ray.util.state.api import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        try:
            client = StateApiClient(address=self.url, headers=auth_headers(self.token))
            # NOTE: StateApiClient takes no `verify` (its base class, SubmissionClient, does).
            client._verify = self.verify
            options = ListApiOptions(filters=filters, detail=detail, timeout=timeout)  # type: ignore[arg-type]
            if limit:
                options.limit = limit
            return client.list(StateResource(resource), options=options, raise_on_missing_output=False)
        except Exception as exc:
            raise RayApiError(f"State API at {self.url} did not answer: {self._why(exc)}") from exc

    def job_leftovers(self, ray_job_id: str) -> list[str]:
        """Actors still alive and placement groups not yet removed that a Ray job created."""
        actors = self._state_list("actors", [("job_id", "=", ray_job_id), ("state", "=", "ALIVE")])
        groups = self._state_list("placement_groups", [("creator_job_id", "=", ray_job_id)])
        return [f"actor {a.actor_id} ({a.class_name}{_named(a)})" for a in actors] + [
            f"placement group {g.placement_group_id} ({g.state})" for g in groups if g.state != "REMOVED"
        ]

    def pending_demands(
        self, ray_job_id: str, groups: tuple[str, ...] = (), limit: int = 200
    ) -> list[dict[str, Any]]:
        """What a Ray job waits for: its actors pending creation (those in a placement group with
        no bundles: the group holds their resources), its placement groups pending (each bundle,
        and whether Ray's scheduler marked it INFEASIBLE), with those named in `groups` whoever
        made them (an SPMD job's group, made for it by the launch host when it was submitted),
        and its tasks waiting for a node. Each: {kind, name, bundles, ray_infeasible, pg_id}."""
        from ray.util.state.common import ActorState, PlacementGroupState, TaskState

        found: list[dict[str, Any]] = []
        job = ("job_id", "=", ray_job_id)
        for a in self._state_list(
            "actors", [job, ("state", "=", "PENDING_CREATION")], detail=True, limit=limit
        ):
            if isinstance(a, ActorState) and a.required_resources:
                bundles = [] if a.placement_group_id else [a.required_resources]
                found.append(_demand("actor", a.class_name or "actor", bundles))
        for g in self._job_groups(ray_job_id, groups, [("state", "=", "PENDING")], limit):
            if isinstance(g, PlacementGroupState):
                units = [b.get("unit_resources") for b in g.bundles or [] if isinstance(b, dict)]
                bundles = [dict(u or {}) for u in units]
                stats = g.stats if isinstance(g.stats, dict) else {}
                demand = _demand("placement group", g.name or g.placement_group_id[:12], bundles)
                infeasible = stats.get("scheduling_state") == "INFEASIBLE"
                demand.update(pg_id=g.placement_group_id, ray_infeasible=infeasible)
                found.append(demand)
        for t in self._state_list(
            "tasks", [job, ("state", "=", "PENDING_NODE_ASSIGNMENT")], detail=True, limit=limit
        ):
            if (
                isinstance(t, TaskState)
                and t.type == "NORMAL_TASK"
                and not t.placement_group_id
                and t.required_resources
            ):
                found.append(
                    _demand("task", t.func_or_class_name or t.name or "task", [t.required_resources])
                )
        return found

    def log_bounded(self, submission_id: str, limit: int) -> str | None:
        """A job's whole log, unless Ray's answer is over `limit` bytes (then None, and never more
        than `limit` bytes are read: a lagging stream must not pull a multi-GB log into memory)."""
        import json
        import ssl

        import httpx

        verify = (
            ssl.create_default_context(cafile=self.verify) if isinstance(self.verify, str) else self.verify
        )
        url = f"{self.url}/api/jobs/{submission_id}/logs"
        try:
            with httpx.stream(
                "GET", url, headers=auth_headers(self.token), verify=verify, timeout=TIMEOUT
            ) as resp:
                resp.raise_for_status()
                if int(resp.headers.get("content-length") or 0) > limit:
                    return None
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        return None
            return str(json.loads(bytes(body)).get("logs") or "")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise RayApiError(f"the log of {submission_id} was not fetched: {self._why(exc)}") from exc

    def job_errors(self, ray_job_id: str) -> list[dict[str, Any]]:
        """What Ray recorded of a job's failures, each with its node's address, pid and time: the
        failed tasks, with the error Ray hands the caller (an exception raised in an actor method
        is written to no log file), and the actors that died of a crash, an OOM kill or their
        node's loss."""
        from ray.util.state.common import ActorState, NodeState, TaskState

        nodes = {
            n.node_id: n.node_ip
            for n in self._state_list("nodes", [], detail=True)
            if isinstance(n, NodeState)
        }
        dead = [
            a
            for a in self._state_list(
                "actors", [("job_id", "=", ray_job_id), ("state", "=", "DEAD")], detail=True
            )
            if isinstance(a, ActorState)
        ]
        places = {a.actor_id: actor_place(a, nodes) for a in dead}
        tasks = self._state_list(
            "tasks", [("job_id", "=", ray_job_id), ("state", "=", "FAILED")], detail=True
        )
        found = [task_error(t, nodes, places) for t in tasks if isinstance(t, TaskState) and t.error_message]
        for a in dead:
            context = death_context(a)
            if context.get("reason") in DEATHS:
                ip, pid = places[a.actor_id]
                error = str(context.get("error_message") or context.get("reason"))
                found.append({"ip": ip, "pid": pid, "actor": a.class_name, "error": error, "at": None})
        return found

    # ------------------------------------------------------------------ node stats
    def _get(self, path: str, **params: str) -> Any:
        """The `data` of one of the dashboard's own REST endpoints (no SDK client covers them)."""
        import ssl

        import httpx

        verify = (
            ssl.create_default_context(cafile=self.verify) if isinstance(self.verify, str) else self.verify
        )
        try:
            resp = httpx.get(
                f"{self.url}{path}",
                params=params,
                headers=auth_headers(self.token),
                verify=verify,
                timeout=TIMEOUT,
            )
            resp.raise_for_status()
            return resp.json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise RayApiError(f"dashboard {self.url}{path} did not answer: {self._why(exc)}") from exc

    def node_stats(self) -> list[dict[str, Any]]:
        """Ray's own per-node figures (what the dashboard's Cluster tab shows; no Prometheus):
        CPU %, memory, GPUs (utilisation, MiB), and the raylet's node id and state."""
        return list(self._get("/nodes", view="summary").get("summary") or [])

    def node_work(self, node_id: str) -> list[str]:
        """The Ray job id of each actor alive and each task running on one node (what its drain
        waits for; not the node's SPMD launch host, launch/pool.py, whose launches count through
        their job's placement group)."""
        actors = self._state_list("actors", [("node_id", "=", node_id), ("state", "=", "ALIVE")])
        actors = [a for a in actors if not str(getattr(a, "name", "") or "").startswith(LAUNCH_HOSTS)]
        tasks = self._state_list("tasks", [("node_id", "=", node_id), ("state", "=", "RUNNING")])
        return [str(getattr(w, "job_id", "") or "") for w in [*actors, *tasks]]

    def dead_nodes(self) -> list[NodeSummary]:
        """Ray nodes the GCS reports DEAD (their raylet ended or stopped answering)."""
        from ray.util.state.common import NodeState

        dead = self._state_list("nodes", [("state", "=", "DEAD")], detail=True, limit=10000)
        return [
            NodeSummary(n.node_id, n.node_ip, bool(n.is_head_node), {}, (n.end_time_ms or 0) / 1000)
            for n in dead
            if isinstance(n, NodeState)
        ]

    def _job_groups(
        self,
        ray_job_id: str,
        groups: tuple[str, ...],
        filters: list[tuple[str, str, str]] | None = None,
        limit: int | None = None,
    ) -> list[Any]:
        """The placement groups a Ray job created, and those named in `groups` whoever made them
        (an SPMD job's, made for it by the launch host at the submit), as the State API details
        them; `filters` narrow both."""
        found: list[Any] = []
        for by in [("creator_job_id", "=", ray_job_id)] + [("name", "=", name) for name in groups]:
            found += self._state_list("placement_groups", [by, *(filters or [])], detail=True, limit=limit)
        return found

    def job_nodes(self, ray_job_id: str, groups: tuple[str, ...] = ()) -> set[str]:
        """The ids of the nodes where a Ray job's actors and tasks ran, whatever became of them, and
        those its placement groups hold (an SPMD job's ranks on the launch hosts: launch/pool.py),
        with the groups named in `groups` whoever made them (the launch host, at the submit)."""
        job = [("job_id", "=", ray_job_id)]
        work = [*self._state_list("actors", job, limit=10000), *self._state_list("tasks", job, limit=10000)]
        found = self._job_groups(ray_job_id, groups)
        bundles = [b for g in found for b in (getattr(g, "bundles", None) or []) if isinstance(b, dict)]
        held = {str(b["node_id"]) for b in bundles if b.get("node_id")}
        return {str(w.node_id) for w in work if getattr(w, "node_id", None)} | held

    def node_processes(self, node_id: str) -> list[dict[str, Any]]:
        """The Ray worker and agent processes of one node with their CPU % (psutil's)."""
        return list(self._get(f"/nodes/{node_id}").get("detail", {}).get("workers") or [])

    # ------------------------------------------------------------------ jobs
    def submit(
        self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any], **options: Any
    ) -> None:
        """Submit a job. Raises a RayApiError (AlreadyExists, RayUnreachable, ...) for Ray's refusal;
        what the packaging of its working_dir raises (OSError, ValueError) passes unchanged."""
        try:
            self.jobs.submit_job(
                entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env, **options
            )
        except (RuntimeError, OSError) as exc:
            translated = translate(exc)
            if type(translated) is RayApiError and not isinstance(exc, RuntimeError):
                raise  # (a local file error while packaging, not Ray's answer)
            raise translated from exc

    def info(self, submission_id: str) -> JobDetails | None:
        """Ray's JobDetails, or None when Ray does not know this submission id."""
        try:
            return self.jobs.get_job_info(submission_id)
        except RuntimeError as exc:
            if isinstance(translate(exc), NotFound):
                return None
            raise

    def logs(self, submission_id: str) -> str:
        return str(self.jobs.get_job_logs(submission_id))

    def stop(self, submission_id: str) -> bool:
        return bool(self.jobs.stop_job(submission_id))

    def list_jobs(self) -> list[Any]:
        return list(self.jobs.list_jobs())


def _named(actor: Any) -> str:
    """How a named actor (detached ones most often are) is found again: its name and namespace."""
    return f" named {actor.name!r} in namespace {actor.ray_namespace!r}" if actor.name else ""


def _demand(kind: str, name: str, bundles: list[dict[str, float]]) -> dict[str, Any]:
    return {"kind": kind, "name": name, "bundles": bundles, "ray_infeasible": False, "pg_id": None}


def pg_strategies(gcs_address: str) -> dict[str, str]:
    """Placement group id -> strategy (STRICT_SPREAD, ...) of the groups the GCS's autoscaler
    state lists as pending (the State API does not report a group's strategy)."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    try:
        status = get_cluster_status(gcs_address, timeout=TIMEOUT)
    except Exception as exc:
        raise RayApiError(f"GCS at {gcs_address} did not report its demands: {short(exc)}") from exc
    return {d.pg_id: str(d.strategy) for d in status.resource_demands.placement_group_demand if d.pg_id}


def ray_state(info: Any) -> str:
    """Ray's JobStatus of a JobDetails as a plain string."""
    return str(info.status.value if hasattr(info.status, "value") else info.status)


def available_gpus(gcs_address: str) -> tuple[float, float]:
    """(available, total) GPUs as the GCS reports them (what `ray status` shows).

    NOTE: ray.autoscaler.v2.sdk is what `ray status` uses. It authenticates with this process's
    RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH: only the runner, which inherits its node's, calls it.
    """
    from ray.autoscaler.v2.sdk import get_cluster_status

    try:
        status = get_cluster_status(gcs_address, timeout=TIMEOUT)
    except Exception as exc:
        raise RayApiError(f"GCS at {gcs_address} did not report its resources: {short(exc)}") from exc
    return status.available_resources().get("GPU", 0.0), status.total_resources().get("GPU", 0.0)


def drain_argv(gcs: str, node_id: str, why: str, deadline_s: float) -> list[str]:
    """`ray drain-node`: Ray's GCS drain API (the one autoscaler v2 uses): the node takes no new
    work, and the GCS is told it goes at the deadline (its caller ends it then). Run with the
    cluster's Ray environment (its token, its TLS)."""
    return [
        str(Path(sys.executable).parent / "ray"),
        "drain-node",
        f"--address={gcs}",
        f"--node-id={node_id}",
        "--reason=DRAIN_NODE_REASON_PREEMPTION",
        f"--reason-message={why}",
        f"--deadline-remaining-seconds={max(0, int(deadline_s))}",
    ]
