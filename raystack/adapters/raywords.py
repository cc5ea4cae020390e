"""What Ray says when a job, task or actor fails, in one line: the death Ray records of an actor
(and where it ran), a task's error, and a job's message from Ray's status."""

from __future__ import annotations

import re
from typing import Any

# Why an actor died that counts as a failure (not its job's end, ray.kill or going out of scope)
DEATHS = ("WORKER_DIED", "OUT_OF_MEMORY", "NODE_DIED")


# Where a task's error says it ran: `ray::Learner.step() (pid=122, ip=10.200.0.13, actor_id=...)`.
# Ray may leave a failed actor task's worker_pid at 0 (seen on the testbed for an exception raised
# in an actor method); its error text still names the worker.
RAN_AT = re.compile(r"\(pid=(\d+), ip=([0-9a-fA-F.:]+)")


# An actor of a node that died: "The actor died because its node has died. Node Id: <hex>" (Ray
# leaves the dead actor's node and address empty).
NODE_ID = re.compile(r"Node Id: ([0-9a-f]{16,})")


def death_context(a: Any) -> dict[str, Any]:
    """What Ray recorded of a dead actor's death (Ray's ActorState): reason, message, node, pid."""
    return dict((a.death_cause or {}).get("actor_died_error_context", {}))


def actor_place(a: Any, nodes: dict[str, str]) -> tuple[str | None, int | None]:
    """Where a dead actor's process ran (Ray's ActorState): its node's address and its pid."""
    context = death_context(a)
    died_on = NODE_ID.search(str(context.get("error_message") or ""))
    ip = context.get("node_ip_address") or nodes.get(a.node_id or "") or (died_on and nodes.get(died_on[1]))
    return ip or None, a.pid or context.get("pid") or None


def task_error(
    t: Any, nodes: dict[str, str], places: dict[str, tuple[str | None, int | None]]
) -> dict[str, Any]:
    """One failed task (Ray's TaskState) as job_errors says it. A task whose actor's process died
    under it (SIGKILL, a crash) may be recorded before its worker said where it ran (its task
    events die with it: no pid, at times no node either); the dead actor's record (`places`)
    still has both."""
    name = t.func_or_class_name or t.name or "task"
    text = str(t.error_message)
    ran_at, died_on = RAN_AT.search(text), NODE_ID.search(text)
    actor_ip, actor_pid = places.get(t.actor_id or "", (None, None))
    return {
        "ip": nodes.get(t.node_id or "")
        or (ran_at and ran_at[2])
        or (died_on and nodes.get(died_on[1]))
        or actor_ip,
        "pid": t.worker_pid or (ran_at and int(ran_at[1])) or actor_pid,
        "actor": name.split(".")[0] if t.actor_id else f"task {name}",
        "error": text,
        "at": (t.end_time_ms or 0) / 1000 or None,
    }


STATUS = re.compile(r"Request failed with status code (\d{3})\b")


# The last line of a Python traceback: `ValueError: Could not find Conda executable at conda.`
RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)(: .*)?$")


ON_NODE = re.compile(r"\[Node ([^\]]+)\] Traceback")


TAIL = 500  # characters kept of the end of an error's later lines


def job_message(text: str) -> str:
    """Ray's message of a job that ended before its driver ran (its runtime_env could not be set
    up) holds a node's whole traceback: its first line, the node and the error it ended with (the
    last of a chain) say it in one line. Any other message as it is."""
    lines = text.strip().splitlines()
    if "Traceback (most recent call last):" not in text or not lines:
        return text
    raised = [i for i, ln in enumerate(lines) if RAISED.match(ln.strip())]
    if not raised:
        return text
    node = ON_NODE.search(text)
    on_node = f" on node {node.group(1)}" if node else ""
    error = lines[raised[-1]].strip()
    rest = " ".join(ln.strip() for ln in lines[raised[-1] + 1 :] if ln.strip())  # (its message's lines:
    rest = rest if len(rest) <= TAIL else "... " + rest[-TAIL:]  # pip's output, whose end says why)
    return f"{lines[0].strip().rstrip('.')}{on_node}: {error}" + (f" {rest}" if rest else "")
