"""The token never goes to an address a stale record names: `stop`, `top`, `status` and the
Python API ask SLURM first whether the allocation that published the dashboard still runs."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from raystack import waiting
from raystack.adapters import slurm
from raystack.adapters.slurm import parse
from raystack.client import Cluster, Job
from raystack.client.top import snapshot
from raystack.errors import ClusterError
from raystack.store import cluster as clusters
from raystack.store import queue
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRequest, update_job


class Listener(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Listener.seen.append(str(self.headers.get("Authorization")))
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A READY-looking record whose dashboard address is now someone else's listener."""
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    server = HTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    clusters.create("c")
    url = f"http://127.0.0.1:{server.server_port}"
    clusters.write(
        ClusterRecord(
            name="c", state=ClusterState.READY, allocation_id="4242", dashboard_url=url, gcs_address="x:1"
        )
    )
    Listener.seen = []
    yield monkeypatch
    server.shutdown()


@pytest.mark.parametrize("slurm_says", [None, "COMPLETED"])
def test_no_request_carries_the_token_to_an_ended_allocations_address(stale, slurm_says) -> None:  # type: ignore[no-untyped-def]
    info = None if slurm_says is None else parse.answer("4242", slurm_says)
    stale.setattr(slurm, "job_info", lambda job_id: info)
    stale.setattr(waiting.REAL, "sleep", lambda s: None)  # (it asks SLURM 4 times before it gives up)
    request = JobRequest(id="j-1", name="j", cluster="c", entrypoint="true")
    queue.enqueue(request)
    queue.start("c", queue.waiting("c")[0], "4242")
    update_job("c", "j-1", state="RUNNING")
    Job("c", "j-1").stop(wait=False)  # recorded for the runner; nothing sent
    view = snapshot("c", processes=False)  # (SLURM says it ended: shown ended, nothing asked)
    assert view["ended"] if slurm_says else view["ray_error"], view
    with pytest.raises(ClusterError, match=r"nothing was sent|has no dashboard"):
        Cluster("c").dashboard()
    assert Listener.seen == []  # (a request sent would have been answered before its caller went on)
