"""Grown allocations leaving the cluster (`raystack shrink`): a duty of the head's node program.

Their Ray nodes are drained through Ray's GCS drain API (`ray drain-node`, the API autoscaler v2
uses): nothing new lands there. Once no actor or task runs on them (or the allocation's drain
deadline has passed), the record says `released`: their node programs stop their Ray and leave,
and `shrink` ends the allocation.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable

from raystack.adapters.ray import Dashboard, NodeSummary, drain_argv
from raystack.errors import RayApiError
from raystack.store import cluster as records
from raystack.store.cluster import ClusterRecord, Grown

log = logging.getLogger("raystack.node")


def nodes_of(record: ClusterRecord, grown: Grown, alive: list[NodeSummary]) -> list[NodeSummary]:
    """The alive Ray nodes of a grown allocation (by the addresses its node programs announced)."""
    entries = records.read_node_entries(record.name)
    ips = {e.get("ip") for e in entries.values() if e.get("alloc_id") == grown.alloc_id}
    return [n for n in alive if n.ip in ips and not n.is_head]


class Leaving:
    """Each pass: drain what `shrink` asked to leave; release it once idle or at its deadline."""

    def __init__(
        self,
        name: str,
        dashboard: Callable[[], Dashboard | None],
        env: dict[str, str],
        now: Callable[[], float] = time.time,
        run: Callable[[list[str], dict[str, str]], str | None] | None = None,
    ):
        self.name, self.dashboard, self.env, self.now = name, dashboard, env, now
        self.run = run or drain

    def __call__(self) -> None:
        record = records.read(self.name)
        api = self.dashboard()
        for grown in record.grown:
            if api is not None and grown.leaving and not grown.released:
                self.step(record, grown, api)

    def step(self, record: ClusterRecord, grown: Grown, api: Dashboard) -> None:
        nodes = nodes_of(record, grown, api.alive_nodes())
        if grown.drained is None:
            for node in nodes:
                refused = self.run(
                    drain_argv(
                        str(record.gcs_address), node.node_id, grown.leaving or "shrink", grown.deadline
                    ),
                    self.env,
                )
                if refused:
                    log.warning(
                        "Ray did not drain node %s of allocation %s: %s", node.ip, grown.alloc_id, refused
                    )
            log.info(
                "allocation %s leaving (%s): %d Ray nodes drained", grown.alloc_id, grown.leaving, len(nodes)
            )
            self.mark(grown.alloc_id, drained=self.now())
            return
        try:
            busy = sum(api.node_busy(n.node_id) for n in nodes)
        except RayApiError:
            busy = -1  # (the State API did not answer: wait for the deadline or the next pass)
        late = self.now() - grown.drained >= grown.deadline
        if busy == 0 or late:
            why = "its nodes are idle" if busy == 0 else f"its drain deadline ({grown.deadline:.0f}s) passed"
            log.info("allocation %s released: %s", grown.alloc_id, why)
            self.mark(grown.alloc_id, released=self.now())

    def mark(self, alloc_id: str, **fields: float) -> None:
        records.note_grown(self.name, alloc_id, **fields)


def drain(argv: list[str], env: dict[str, str]) -> str | None:
    """Run `ray drain-node`; None when Ray took the drain, else why not."""
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return (
        None
        if done.returncode == 0
        else (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"
    )
