"""Reading what Ray's State API recorded of a failed job (Ray's own state classes, no cluster)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import requests
from ray.util.state.common import ActorState, NodeState, TaskState

from raystack import errors
from raystack.adapters.ray import Dashboard, translate

ERROR = (
    "ray::Learner.step() (pid=122, ip=10.200.0.13, actor_id=0be7, repr=<train.Learner object>)\n"
    '  File "train.py", line 11, in step\nRuntimeError: CUDA out of memory (simulated)'
)


class Recorded(Dashboard):
    """A dashboard whose State API answers with given rows."""

    def __init__(self, rows: dict[str, list[Any]]):
        super().__init__("http://127.0.0.1:1", "t")
        self.rows = rows

    def _state_list(self, resource: str, filters: Any, detail: bool = False, timeout: int = 10) -> list[Any]:
        return self.rows.get(resource, [])


def task(**fields: Any) -> TaskState:
    base = dict(task_id="t1", attempt_number=0, name="Learner.step", state="FAILED", job_id="02000000",
                actor_id="0be7", type="ACTOR_TASK", func_or_class_name="Learner.step", parent_task_id="p",
                node_id=None, worker_id=None, worker_pid=None, error_type="TASK_EXECUTION_EXCEPTION",
                error_message=ERROR, end_time_ms=5000)  # fmt: skip
    return TaskState(**{**base, **fields})


def test_a_failed_actor_task_without_a_worker_pid_is_placed_by_its_error_text() -> None:
    # As Ray 2.60 recorded an actor method's exception on the testbed: worker_pid 0, node_id empty.
    (event,) = Recorded({"tasks": [task(worker_pid=0)]}).job_errors("02000000")
    assert (event["ip"], event["pid"], event["actor"], event["at"]) == ("10.200.0.13", 122, "Learner", 5.0)


def test_a_failed_task_with_its_node_and_pid_keeps_them() -> None:
    node = NodeState(node_id="n1", node_ip="10.200.0.14", is_head_node=False, state="ALIVE",
                     state_message=None, node_name="node4", resources_total={}, labels={})  # fmt: skip
    rows = {"nodes": [node], "tasks": [task(node_id="n1", worker_pid=7, actor_id=None, name="f",
                                            func_or_class_name="f")]}  # fmt: skip
    (event,) = Recorded(rows).job_errors("02000000")
    assert (event["ip"], event["pid"], event["actor"]) == ("10.200.0.14", 7, "task f")


def test_a_task_whose_node_died_is_placed_on_that_node() -> None:
    # As the soak test saw it (Ray 2.60): a task of an actor on a SIGKILLed node, no node or pid of
    # its own, Ray's message naming the node by its id.
    dead = "cc07f81ac8a142c967f07dd7dfc3de6ba9f51e676276d7d021ef5d8b"
    node = NodeState(node_id=dead, node_ip="10.200.0.14", is_head_node=False, state="DEAD",
                     state_message=None, node_name="node4", resources_total={}, labels={})  # fmt: skip
    text = f"The actor died because its node has died. Node Id: {dead}"
    (event,) = Recorded({"nodes": [node], "tasks": [task(worker_pid=0, error_message=text)]}).job_errors(
        "02000000"
    )
    assert event["ip"] == "10.200.0.14"


def test_a_task_whose_actor_process_died_is_placed_where_its_actor_ran() -> None:
    # An engine SIGKILLed 0.05 s into its generate (tests/testbed/test_grpo.py, once in a fresh
    # run): the job's message said "unknown Engine". Ray 2.60 records such a task without its pid
    # (asked on a local Ray: node set, worker_pid None), at times without its node either (its
    # worker died before its task events went out), and its text names neither; the dead actor's
    # record has both.
    text = (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
        "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."
    )
    node = NodeState(node_id="n2", node_ip="10.200.0.12", is_head_node=False, state="ALIVE",
                     state_message=None, node_name="node2", resources_total={}, labels={})  # fmt: skip
    actor = ActorState(actor_id="0be7", class_name="Engine", state="DEAD", job_id="02000000", name="",
                       node_id="n2", pid=14600, ray_namespace="ns",
                       death_cause={"actor_died_error_context": {"reason": "WORKER_DIED",
                                                                 "error_message": text}})  # fmt: skip
    dead = task(worker_pid=None, node_id=None, name="Engine.generate", func_or_class_name="Engine.generate",
                error_message=text)  # fmt: skip
    events = Recorded({"nodes": [node], "actors": [actor], "tasks": [dead]}).job_errors("02000000")
    assert [(e["ip"], e["pid"], e["actor"]) for e in events] == [("10.200.0.12", 14600, "Engine")] * 2


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        # what Ray 2.60's JobSubmissionClient raises (dashboard_sdk._raise_error and requests)
        (
            RuntimeError(
                "Request failed with status code 400: Job with submission_id a-1 already exists. "
                "Please use a different submission_id.."
            ),
            errors.AlreadyExists,
        ),
        (RuntimeError("Request failed with status code 404: Job a-1 does not exist.."), errors.NotFound),
        (RuntimeError("Request failed with status code 401: Unauthorized."), errors.AuthRejected),
        (requests.ConnectionError("Max retries exceeded with url: /api/version"), errors.RayUnreachable),
        (requests.Timeout("read timed out"), errors.RayUnreachable),
        (RuntimeError("Request failed with status code 500: boom."), errors.RayApiError),
        # CI at 1cf33c8: a job id's hex held "401": its 404 was taken for a refused token, and the
        # queue runner's every pass failed on it for good (a retry not yet submitted)
        (
            RuntimeError("Request failed with status code 404: Job flaky-401281ad-retry1 does not exist."),
            errors.NotFound,
        ),
        (
            RuntimeError("Request failed with status code 404: Job Unauthorized-1 does not exist."),
            errors.NotFound,
        ),
        (RuntimeError("Request failed with status code 500: job a-40440404 boom."), errors.RayApiError),
        (RuntimeError("Request failed with status code 500: file x does not exist."), errors.RayApiError),
    ],
)
def test_ray_answers_are_typed_where_they_arrive(exc: BaseException, kind: type) -> None:
    translated = translate(exc)
    assert type(translated) is kind and str(exc) in str(translated)


def test_a_dashboard_that_does_not_answer_is_unreachable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(errors.RayUnreachable, match="did not answer"):
        Dashboard(f"http://127.0.0.1:{port}", "t").submit("a-1", "true", {})


def test_a_job_whose_runtime_env_failed_is_said_in_one_line_with_its_node_and_error() -> None:
    from pathlib import Path

    from raystack.adapters.raywords import job_message

    # Ray 2.60's message for runtime_env: {conda: myenv} on nodes without conda (testbed), two
    # chained tracebacks: the last exception is what went wrong.
    recorded = (Path(__file__).parents[1] / "fixtures" / "ray" / "conda_missing.message.txt").read_text()
    assert len(recorded) > 2000 and recorded.count("Traceback") == 2
    assert job_message(recorded) == (
        "runtime_env setup failed: Failed to set up runtime environment on node 10.200.0.11: "
        "ValueError: Could not find Conda executable at conda."
    )
    for plain in ("Job was intentionally stopped.", "Job entrypoint command failed with exit code 1", ""):
        assert job_message(plain) == plain
    pip = (
        "runtime_env setup failed: Failed to set up runtime environment.\n[Node 10.0.0.2] Traceback (most "
        'recent call last):\n  File "pip.py", line 3, in install\nRuntimeError: Failed to install pip '
        "packages.\nOutput:\nERROR: No matching distribution found for nosuchpkg\n"
    )
    assert job_message(pip) == (
        "runtime_env setup failed: Failed to set up runtime environment on node 10.0.0.2: RuntimeError: "
        "Failed to install pip packages. Output: ERROR: No matching distribution found for nosuchpkg"
    )  # (an error whose message spans lines keeps them)
    pages = pip.replace("Output:\n", "Output:\n" + "Collecting a-package-of-many-words\n" * 50)
    said = job_message(pages)
    assert said.endswith("ERROR: No matching distribution found for nosuchpkg") and len(said) < 800, said
    assert "RuntimeError: Failed to install pip packages. ... " in said  # (the error, then the end)
    odd = "runtime_env setup failed: x\nTraceback (most recent call last):\n  (nothing raised)"
    assert job_message(odd) == odd  # (no error line to say: the message as it is)
