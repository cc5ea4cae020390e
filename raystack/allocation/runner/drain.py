"""After a job ends, before the next one starts: its actors, placement groups and GPUs must be
released (vLLM is known to leave processes holding GPU memory behind)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

from raystack.adapters import ray as rayapi
from raystack.allocation.node import gpus
from raystack.allocation.node.context import GPU_REFRESH
from raystack.errors import RayApiError
from raystack.store import node_entries

log = logging.getLogger("raystack.runner")

FREE_TIMEOUT = float(os.environ.get("RAYSTACK_FREE_TIMEOUT", "600"))
# A node that asks its GPUs every E seconds (its entry's gpu_every) has reported a change of them
# SETTLE x E seconds after a job's end at the latest (one check, and the time it takes).
SETTLE = 2.0
ALIVE = GPU_REFRESH + 15.0  # a node whose report is older than this does not report: wait


@dataclass
class Drain:
    """After a job ends: wait until its actors, placement groups and GPUs are released."""

    job_id: str
    ray_job_id: str | None
    deadline: float
    ended: float = field(default_factory=time.time)  # wall clock: GPU reports must be newer


def gpu_memory_held(
    name: str, since: float, now: float | None = None, here: tuple[int, list[tuple[int, int]]] | None = None
) -> list[str] | None:
    """GPU memory still held on any node by leftover processes of the cluster's jobs.

    Each node program reports, where it has real GPUs, the processes among its descendants that
    hold GPU memory, written when what it sees changes (and every GPU_REFRESH seconds). So a
    report from after `since` (the job's end) counts, and so does an empty report from before it
    once SETTLE checks of that node have passed (nothing changed since: nothing is held). None
    means wait: a node whose last report held memory, or that has not reported for ALIVE seconds.
    `here`: the pid of the node program of the caller's node and what that node's GPUs hold now,
    asked by the caller itself (NVML, well under a millisecond): that node needs no settling.
    """
    now = time.time() if now is None else now
    held = []
    for host, entry in node_entries.read_node_entries(name).items():
        if "gpu_checked" not in entry:
            continue  # no real GPUs on that node to check
        if here is not None and entry.get("pid") == here[0]:
            held += [f"{host} pid {pid} ({mib} MiB)" for pid, mib in here[1]]
            continue
        checked, procs = float(entry["gpu_checked"]), entry.get("gpu_procs") or []
        settle = SETTLE * float(entry.get("gpu_every", 1.0))  # (a node from before gpu_every: 1 s)
        if checked < since:
            if procs or now - since < settle or now - checked > ALIVE:
                return None
            continue
        held += [f"{host} pid {pid} ({mib} MiB)" for pid, mib in procs]
    return held


class Leftovers(Protocol):
    def job_leftovers(self, ray_job_id: str) -> list[str]: ...


def nodes_free(api: Leftovers, drain: Drain, now: float) -> bool:
    """A packed job's nodes are free again once no actor or placement group of it is left (or
    at its deadline). A driver that never called ray.init() has no Ray job id, so nothing left:
    the State API refuses an empty id, and asking with one failed every pass until the deadline.
    Where the State API does not answer, the nodes stay held and the next pass asks again."""
    if now > drain.deadline or not drain.ray_job_id:
        return True
    try:
        return not api.job_leftovers(drain.ray_job_id)
    except RayApiError as exc:
        log.warning("cannot check the resources of %s: %s", drain.job_id, exc)
        return False


def this_node() -> tuple[int, list[tuple[int, int]]] | None:
    """The queue runner runs on the head, a child of its node program: that node's GPUs are asked
    here, now, where NVML loads (a subprocess per check otherwise: the node's report is used)."""
    if gpus.source() != "nvml":
        return None
    parent = os.getppid()
    return parent, gpus.gpu_processes(root=parent)


def still_held(api: Leftovers, drain: Drain, gcs_address: str, name: str) -> str | None:
    """What an ended job has not released yet (its actors and placement groups, GPUs Ray counts
    in use, GPU memory its processes hold), or None once everything is free. Raises RayApiError."""
    if drain.ray_job_id:
        left = api.job_leftovers(drain.ray_job_id)
        if left:
            return ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    available, total = rayapi.available_gpus(gcs_address)
    if available < total:
        return f"{total - available:g} of {total:g} GPUs in use in Ray"
    held = gpu_memory_held(name, since=drain.ended, here=this_node())
    if held is None:
        return "the nodes' GPU reports since it ended"
    return "GPU memory held by " + ", ".join(held[:3]) if held else None


def check(api: Leftovers, drain: Drain, gcs_address: str, name: str, now: float) -> tuple[bool, dict | None]:
    """Whether an ended job's resources are free (`still_held`; at its deadline anyway, or not
    when Ray does not answer), and what is still held and until when (None: nothing)."""
    if now > drain.deadline:
        log.warning(
            "resources of %s not free after %.0fs; starting the next job anyway", drain.job_id, FREE_TIMEOUT
        )
        return True, None
    try:
        why = still_held(api, drain, gcs_address, name)
    except RayApiError as exc:
        log.warning("cannot check resources: %s", exc)
        return False, None
    if why is None:
        return True, None
    return False, {"job": drain.job_id, "held": why, "until": time.time() + drain.deadline - now}
