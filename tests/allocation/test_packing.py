"""Jobs side by side, dependencies and pip checks in the queue runner (fake Jobs API, no Ray);
the scheduler's choices as a pure function. On the real testbed: tests/testbed/test_jobs_together.py."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from raystack.adapters.ray import NodeSummary
from raystack.allocation.runner import pipcheck
from raystack.allocation.runner.schedule import BACKFILL, Board, Want, choose
from raystack.launch import PIN_DIR
from raystack.plan.topology import nodes_wanted
from raystack.store import queue
from raystack.store.ledger import JobState, read_job, update_job

from .test_runner import FakeApi, home, runner, state, submit  # noqa: F401 (home is a fixture)

FOUR = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


def four_nodes(api: FakeApi) -> FakeApi:
    api.nodes = [
        NodeSummary(f"id{i}", f"10.0.0.{i}", i == 1, {"CPU": 16.0, "GPU": 4.0}) for i in (1, 2, 3, 4)
    ]
    return api


# ---------------------------------------------------------------------------- the pure choice
def test_jobs_that_declare_nothing_run_alone_and_in_order() -> None:
    wants = [Want("a", None), Want("b", None)]
    assert [(w.job_id, n) for w, n in choose(wants, Board(FOUR), {})] == [("a", None)]
    assert choose(wants, Board(FOUR, whole=True), {}) == []
    assert choose(wants, Board(FOUR, held={"x": ["10.0.0.1"]}), {}) == []


def test_four_one_node_jobs_start_at_once_on_distinct_nodes() -> None:
    picked = choose([Want(f"j{i}", 1) for i in range(5)], Board(FOUR), {})
    assert [w.job_id for w, _ in picked] == ["j0", "j1", "j2", "j3"]
    assert sorted(n[0] for _, n in picked if n) == FOUR


def test_backfill_is_bounded_and_never_passes_a_whole_cluster_job() -> None:
    board = Board(FOUR, held={"running": FOUR[:2]})
    overtaken: dict[str, int] = {}
    # a 3-node job waits for room; 1-node jobs behind it fill the two free nodes
    picked = choose([Want("big", 3), Want("s1", 1), Want("s2", 1), Want("s3", 1)], board, overtaken)
    assert [w.job_id for w, _ in picked] == ["s1", "s2"] and overtaken == {"big": 2}
    overtaken["big"] = BACKFILL  # (enough jobs went ahead of it: none more does)
    assert choose([Want("big", 3), Want("s4", 1)], Board(FOUR, held={"r": FOUR[:2]}), overtaken) == []
    # a whole-cluster job at the head: nothing passes it, even with free nodes
    assert choose([Want("all", None), Want("s5", 1)], Board(FOUR, held={"r": FOUR[:1]}), {}) == []


@pytest.mark.parametrize(
    ("needs", "nodes"),
    [
        ({}, None),
        ({"nodes": 2}, 2),
        ({"gpus": 4}, 1),
        ({"gpus": 6}, 2),
        ({"gpus": 4, "cpus": 40}, 3),
        ({"gpus": 0}, 1),
    ],
)
def test_needs_round_up_to_whole_nodes(needs: dict, nodes: int | None) -> None:
    assert nodes_wanted(needs, (4, 4, 16)) == nodes


# ---------------------------------------------------------------------------- in the runner
@pytest.mark.usefixtures("home")
def test_packed_jobs_run_side_by_side_pinned_to_their_own_nodes() -> None:
    api = four_nodes(FakeApi())
    r = runner(api)
    r.cluster.gpus_per_node, r.cluster.cpus_per_node = 4, 16
    jobs = [submit(name=f"p{i}", needs={"nodes": 1}) for i in range(4)]
    alone = submit(name="alone")
    r.tick()
    assert api.submitted == jobs and state(alone) is JobState.QUEUED
    pins = [api.env[j]["RAYSTACK_PIN_NODES"] for j in jobs]
    assert sorted(pins) == ["id1", "id2", "id3", "id4"]
    assert all(api.env[j]["PYTHONPATH"].startswith(f"{PIN_DIR}:") for j in jobs)
    assert [read_job("c", j).attempts[-1].nodes for j in jobs] == [[ip] for ip in FOUR]
    for j in jobs:
        api.set(j, "RUNNING")
    r.tick()
    api.set(jobs[0], "SUCCEEDED", 0)
    r.tick()
    r.tick()
    assert alone not in api.submitted  # (three are still running)
    for j in jobs[1:]:
        api.set(j, "SUCCEEDED", 0)
    for _ in range(3):
        r.tick()
    assert api.submitted[-1] == alone and "RAYSTACK_PIN_NODES" not in api.env[alone]


@pytest.mark.usefixtures("home")
def test_a_packed_driver_is_placed_on_its_first_node() -> None:
    api = four_nodes(FakeApi())
    seen: dict[str, dict] = {}
    submit_orig = api.submit

    def submit_spy(sid: str, entrypoint: str, runtime_env: dict, **options: object) -> None:
        seen[sid] = dict(options)
        submit_orig(sid, entrypoint, runtime_env, **options)

    api.submit = submit_spy  # type: ignore[method-assign]
    r = runner(api)
    r.cluster.gpus_per_node = 4
    job = submit(name="two", needs={"gpus": 8})
    r.tick()
    assert read_job("c", job).attempts[-1].nodes == FOUR[:2]
    assert seen[job]["entrypoint_resources"] == {"node:10.0.0.1": 0.001}
    assert api.env[job]["RAYSTACK_NODES"] == "10.0.0.1,10.0.0.2"


@pytest.mark.usefixtures("home")
def test_dependencies_wait_then_run_or_are_cancelled_when_they_cannot_be_met() -> None:
    api = FakeApi()
    r = runner(api)
    first = submit(name="train")
    ok = submit(name="eval", after=[f"{first}:ok"])
    notok = submit(name="report", after=[f"{first}:notok"])
    anyway = submit(name="cleanup", after=[first + ":any"])
    r.tick()
    assert api.submitted == [first]
    api.set(first, "RUNNING")
    r.picker.dep_checked.clear()
    r.tick()
    assert read_job("c", ok).message == f"waits for afterok:{first}"
    api.set(first, "FAILED", 1)
    for _ in range(4):
        r.picker.dep_checked.clear()
        r.tick()
    assert state(ok) is JobState.CANCELLED
    assert (
        read_job("c", ok).message
        == f"cancelled: dependency {first} ended FAILED: afterok:{first} can never be met"
    )
    assert notok in api.submitted and anyway not in api.submitted  # (one at a time: notok first)
    api.set(notok, "SUCCEEDED", 0)
    for _ in range(3):
        r.picker.dep_checked.clear()
        r.tick()
    assert anyway in api.submitted and queue.waiting("c") == []


@pytest.mark.usefixtures("home")
def test_a_job_waiting_for_a_dependency_does_not_block_the_queue() -> None:
    api = FakeApi()
    r = runner(api)
    first = submit(name="long")
    waits = submit(name="after", after=[first])
    free = submit(name="free")
    r.tick()
    api.set(first, "SUCCEEDED", 0)
    for _ in range(3):
        r.picker.dep_checked.clear()
        r.tick()
    assert api.submitted[:2] == [first, waits] and free not in api.submitted  # (in order: after came first)
    api.set(waits, "SUCCEEDED", 0)
    r.tick()
    r.tick()
    assert api.submitted == [first, waits, free]
    update_job("c", free, message="")


@pytest.mark.usefixtures("home")
def test_packed_jobs_whose_drivers_never_called_ray_init_free_their_nodes_at_once() -> None:
    """`python -c ...` with needs: Ray gives its submission no Ray job id; the State API refuses
    an empty one (`ID string needs to have length 4, got 0`), and asking with it failed every
    runner pass for ten minutes (FREE_TIMEOUT): nothing else started or was followed."""
    from raystack.errors import RayApiError

    api = four_nodes(FakeApi())

    def leftovers(ray_job_id: str) -> list[str]:
        if not ray_job_id:
            raise RayApiError("State API did not answer: ID string needs to have length 4, got 0")
        return []

    api.job_leftovers = leftovers  # type: ignore[method-assign]
    r = runner(api)
    r.cluster.gpus_per_node, r.cluster.cpus_per_node = 4, 16
    jobs = [submit(name=f"p{i}", needs={"gpus": 4}) for i in range(3)]
    whole = submit(name="whole")
    r.tick()
    assert api.submitted == jobs
    for j in jobs:
        api.ray[j].job_id = None  # type: ignore[assignment]  # (no ray.init() in the driver)
        api.set(j, "RUNNING")
    r.tick()
    for j in jobs:
        api.set(j, "SUCCEEDED", 0)
    for _ in range(3):
        r.tick()  # (raised on every pass before)
    assert api.submitted[-1] == whole


# ---------------------------------------------------------------------------- pip, fast
def wheel(folder: Path, name: str = "rstiny", version: str = "0.1") -> Path:
    """A pure-Python wheel made by hand (no build tool, no network)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: raystack-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{info}/RECORD", "")
    return path


def test_pip_from_local_wheels_resolves_and_a_missing_package_fails_in_one_line(tmp_path: Path) -> None:
    wheel(tmp_path / "wheels")
    options = ["--no-index", f"--find-links={tmp_path / 'wheels'}"]
    assert pipcheck.check({"pip": {"packages": ["rstiny"], "pip_install_options": options}}) is None
    why = pipcheck.check({"pip": {"packages": ["nosuchpackage-rs"], "pip_install_options": options}})
    assert why is not None and why.startswith("runtime_env pip: ERROR: ") and "nosuchpackage-rs" in why
    assert "\n" not in why


def test_an_unreachable_index_fails_at_once(tmp_path: Path) -> None:
    with socket_closed() as port:
        why = pipcheck.check(
            {
                "pip": {
                    "packages": ["requests"],
                    "pip_install_options": ["--index-url", f"http://127.0.0.1:{port}/simple"],
                }
            }
        )
    assert why is not None and "cannot reach the package index" in why and "--find-links" in why


def test_a_reachable_index_passes(tmp_path: Path) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        assert (
            pipcheck.check({"uv": {"packages": ["x"], "uv_pip_install_options": ["--index-url", url]}})
            is None
        )
    finally:
        server.shutdown()


class socket_closed:
    """A local port nothing listens on."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *_: object) -> None:
        pass


def test_the_pin_hook_is_plain_python_that_imports_nothing_of_raystack() -> None:
    text = (PIN_DIR / "sitecustomize.py").read_text()
    assert "import raystack" not in text and "from raystack" not in text
    done = subprocess.run([sys.executable, "-c", "import sitecustomize"], env={"PYTHONPATH": str(PIN_DIR)})
    assert done.returncode == 0


def test_a_conda_runtime_env_without_conda_where_ray_looks_fails_with_the_fix(tmp_path: Path) -> None:
    no_conda = {"PATH": str(tmp_path / "empty")}
    why = pipcheck.check({"conda": "myenv"}, env=no_conda)
    assert why is not None and why.startswith(
        "runtime_env conda: no conda on the nodes (Ray runs `conda` on the PATH)"
    )
    assert "setup: [module load miniforge3]" in why and "/path/to/env/bin/python" in why and "\n" not in why
    assert pipcheck.check({"env_vars": {"A": "1"}}, env=no_conda) is None  # (no conda asked)
    conda = tmp_path / "miniforge" / "bin" / "conda"
    conda.parent.mkdir(parents=True)
    conda.write_text("#!/bin/sh\n")
    why = pipcheck.check({"conda": {"dependencies": ["numpy"]}}, env={"CONDA_EXE": str(conda)})
    assert why is not None and f"beside $CONDA_EXE, {conda}" in why  # (there, but not executable)
    conda.chmod(0o755)
    for env in (
        {"CONDA_EXE": str(conda)},
        {"RAY_CONDA_HOME": str(conda.parents[1])},
        {"PATH": str(conda.parent)},
    ):
        assert pipcheck.check({"conda": "myenv"}, env=env) is None, env
    why = pipcheck.check({"conda": "myenv"}, env={"RAY_CONDA_HOME": str(tmp_path), "PATH": str(conda.parent)})
    assert (
        why is not None and f"$RAY_CONDA_HOME/bin/conda, {tmp_path}/bin/conda" in why
    )  # (Ray looks there only)


def test_a_py_executable_that_is_not_there_fails_at_once(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    why = pipcheck.check({"py_executable": "/nonexistent/python -u"}, env=env)
    assert why is not None and why.startswith(
        "runtime_env py_executable: /nonexistent/python is not a program"
    )
    why = pipcheck.check({"py_executable": "uv run --project ."}, env=env)
    assert why is not None and "uv is not a program on the nodes (no such file on the PATH)" in why
    (tmp_path / "uv").write_text("#!/bin/sh\n")
    (tmp_path / "uv").chmod(0o755)
    for fine in ("uv run --project .", sys.executable, ".venv/bin/python", f"{tmp_path}/uv run"):
        assert pipcheck.check({"py_executable": fine}, env=env) is None, fine  # (relative: the working_dir's)
