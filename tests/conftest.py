"""Fixtures: the real local SLURM testbed (slurm/testbed), and a private RAYSTACK_HOME on it.

The testbed is brought up once per session (or reused when already up with enough nodes) and
torn down at the end if this session started it. Set RAYSTACK_KEEP_TESTBED=1 to keep it.

`make test` runs two pytest-xdist workers (`-n 2`, scheduled by `lane`): one runs every testbed
module in order, the other the tests without the testbed beside them. (Only the testbed lane
brings the testbed up. The testbed modules stay in one lane: run beside one another on 2 cores,
their walltime and timeout checks failed; docs/development.md has the run.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTBED = REPO / "slurm" / "testbed"
TESTBED_DIR = Path(os.environ.get("RAYSTACK_TESTBED_DIR", "/var/lib/raystack-testbed"))
NODES = int(os.environ.get("RAYSTACK_TEST_NODES", "4"))
FIXTURES = Path(__file__).parent / "fixtures"


def running_nodes() -> int:
    try:
        return int((TESTBED_DIR / "node-count").read_text())
    except (OSError, ValueError):
        return 0


def testbed_healthy() -> bool:
    """NODES nodes up and answering, not just recorded (the testbed's own check): a machine
    restarted from a snapshot keeps the state folder but none of the daemons."""
    check = subprocess.run([str(TESTBED / "up"), "--check", "--nodes", str(NODES)], capture_output=True)
    return check.returncode == 0


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.2) -> object:
    """Poll a real condition with a deadline (tests never sleep a fixed time)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def lane(nodeid: str) -> str:
    """The worker a test runs on: `testbed` (its modules, and test_packaging, which builds a wheel
    in the checkout as test_ray_range does), or `unit` (everything else)."""
    path = Path(nodeid.split("::", 1)[0])
    return "testbed" if "testbed" in path.parts or path.name == "test_packaging.py" else "unit"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduler by scope, with two scopes: the lanes. (Its `loadgroup` marks do not reach
    pytest 9's node ids.) Each worker takes one lane and runs it in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid)

    return Lanes(config, log)


@pytest.fixture(autouse=True)
def _slurm_answers_of_this_test_only() -> Iterator[None]:
    """The SLURM allocator keeps answers per process (one command asks once per allocation): a
    test that faked one (monkeypatched job_info) must not leave it to the next."""
    yield
    from raystack.adapters.allocator import allocator

    allocator("slurm").forget()


@pytest.fixture(scope="session")
def testbed() -> Iterator[Path]:
    """A running testbed with NODES nodes; yields its shared home folder."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM testbed needs root (network namespaces, slurmd)")
    started = not testbed_healthy()
    if started:
        subprocess.run([str(TESTBED / "up"), "--nodes", str(NODES)], check=True)
    yield TESTBED_DIR / "home"
    if started and not os.environ.get("RAYSTACK_KEEP_TESTBED"):
        subprocess.run([str(TESTBED / "down")], check=True)


@contextlib.contextmanager
def module_home(testbed: Path, name: str) -> Iterator[Path]:
    """RAYSTACK_HOME for a module-scoped fixture (monkeypatch is per test): a folder on the testbed."""
    home = testbed / f"rs-{name}-{os.getpid()}"
    home.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAYSTACK_HOME", str(home))
        yield home


def slurm_jobs_alive(with_names: bool = False) -> list:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True)
    if out.returncode != 0:  # say why: the controller's last words, and whether it still runs
        log = TESTBED_DIR / "log" / "slurmctld.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else ["(no log)"]
        ctld = subprocess.run(["pgrep", "-a", "slurmctld"], capture_output=True, text=True).stdout
        state = f"slurmctld: {ctld.strip() or 'not running'}"
        raise AssertionError("\n".join([f"squeue failed: {out.stderr.strip()}", state, *tail]))
    rows = [tuple(line.split("|", 1)) for line in out.stdout.splitlines() if "|" in line]
    return rows if with_names else [job for job, _ in rows]


@pytest.fixture
def rs_home(testbed: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh RAYSTACK_HOME in the testbed's state folder, seen by every node.

    At the end every cluster still live in it is cancelled, so no test leaks an allocation.
    """
    home = testbed / f"rs-{uuid.uuid4().hex[:8]}"
    home.mkdir(parents=True)
    monkeypatch.setenv("RAYSTACK_HOME", str(home))
    yield home
    from raystack.adapters import slurm

    # Every allocation of this home's clusters, recorded or not (and no one else's).
    names = (
        {f"raystack-{p.name}" for p in (home / "clusters").iterdir()}
        if (home / "clusters").is_dir()
        else set()
    )
    for job, name in slurm_jobs_alive(with_names=True):
        if name in names:
            slurm.scancel(job)
    shutil.rmtree(home, ignore_errors=True)


def processes_of_job(job_id: str) -> list[tuple[int, str]]:
    """Every live process (on any testbed node) started inside SLURM job `job_id`.

    Processes of an allocation, Ray's daemons and workers included, inherit SLURM_JOB_ID.
    """
    found = []
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if cmd.strip():  # zombies have no command line
                    found.append((int(proc.name), cmd.strip()))
        except OSError:
            continue
    return found


SLURM_COMMANDS = ("squeue", "sinfo", "sacct", "scontrol", "sbatch", "scancel")


def slurm_shims(folder: Path) -> Path:
    """Wrappers of SLURM's commands that log every call (one line each) to folder/calls.log and
    then run the real command: put `folder` first on a PATH to count what raystack asks."""
    folder.mkdir(parents=True, exist_ok=True)
    calls = folder / "calls.log"
    calls.touch()
    for name in SLURM_COMMANDS:
        real = shutil.which(name)
        if real is None:
            continue
        shim = folder / name
        shim.write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\nexec {real} "$@"\n')
        shim.chmod(0o755)
    return calls
