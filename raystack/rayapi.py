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
