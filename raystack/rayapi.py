"""The one adapter to a cluster's Ray dashboard: Jobs API and State API, authenticated.

Ray's own SDK clients are used (JobSubmissionClient, StateApiClient). The token travels as an
explicit `Authorization: Bearer` header, which Ray's clients prefer over the process-wide token
cache, so one client process can talk to several clusters with different tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raystack.errors import RayApiError


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class NodeSummary:
    """One alive Ray node as the State API reports it."""

    node_id: str
    ip: str
    is_head: bool
    resources: dict[str, float]


def _jobs_client(url: str, token: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(url, headers=auth_headers(token))
    except Exception as exc:
        raise RayApiError(f"Jobs API at {url} did not answer: {_short(exc)}") from exc


def jobs_api_answers(url: str, token: str) -> bool:
    """True when the Jobs API accepts an authenticated request (lists jobs)."""
    try:
        _jobs_client(url, token).list_jobs()
        return True
    except Exception:
        return False


def alive_nodes(url: str, token: str, timeout: int = 10) -> list[NodeSummary]:
    """Alive nodes with their total resources. Raises RayApiError when the API does not answer."""
    from ray.util.state.api import StateApiClient
    from ray.util.state.common import ListApiOptions, NodeState, StateResource

    try:
        client = StateApiClient(address=url, headers=auth_headers(token))
        nodes = client.list(
            StateResource.NODES,
            options=ListApiOptions(filters=[("state", "=", "ALIVE")], detail=True, timeout=timeout),
            raise_on_missing_output=False,
        )
    except Exception as exc:
        raise RayApiError(f"State API at {url} did not answer: {_short(exc)}") from exc
    return [
        NodeSummary(
            node_id=n.node_id,
            ip=n.node_ip,
            is_head=bool(n.is_head_node),
            resources=dict(n.resources_total or {}),
        )
        for n in nodes
        if isinstance(n, NodeState)
    ]


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _state_list(url: str, token: str, resource: str, filters: list[tuple[str, str, str]]) -> list[Any]:
    from ray.util.state.api import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    try:
        client = StateApiClient(address=url, headers=auth_headers(token))
        return client.list(
            StateResource(resource),
            options=ListApiOptions(filters=filters, timeout=10),  # type: ignore[arg-type]
            raise_on_missing_output=False,
        )
    except Exception as exc:
        raise RayApiError(f"State API at {url} did not answer: {_short(exc)}") from exc


def job_leftovers(url: str, token: str, ray_job_id: str) -> list[str]:
    """Actors still alive and placement groups not yet removed that a Ray job created."""
    actors = _state_list(url, token, "actors", [("job_id", "=", ray_job_id), ("state", "=", "ALIVE")])
    groups = _state_list(url, token, "placement_groups", [("creator_job_id", "=", ray_job_id)])
    return [f"actor {a.actor_id} ({a.class_name})" for a in actors] + [
        f"placement group {g.placement_group_id} ({g.state})" for g in groups if g.state != "REMOVED"
    ]


def available_gpus(gcs_address: str) -> tuple[float, float]:
    """(available, total) GPUs as the GCS reports them (what `ray status` shows)."""
    # NOTE: ray.autoscaler.v2.sdk is what `ray status` uses; the token comes from this
    # process's RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH (the runner inherits the node's).
    from ray.autoscaler.v2.sdk import get_cluster_status

    try:
        status = get_cluster_status(gcs_address, timeout=10)
    except Exception as exc:
        raise RayApiError(f"GCS at {gcs_address} did not report its resources: {_short(exc)}") from exc
    return status.available_resources().get("GPU", 0.0), status.total_resources().get("GPU", 0.0)
