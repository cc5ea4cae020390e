"""raystack from its wheel, on the oldest Rays it takes (the rest of the suite runs on the newest,
the venv of `make install`): 2.54.0, the first without CVE-2026-27482 (token authentication came
in 2.52; the dashboard's DELETE routes were reachable from a browser page before 2.54), and 2.55.1
(OpenRLHF pins 2.55). For each, a clean venv gets the wheel built from this checkout and that Ray, with
every other dependency as pip resolves it from the registry; then, as a user would with it:

* `raystack --version`;
* a one-node cluster on the testbed (SLURM), a queued job that joins it (`ray.init()`) and says
  its Ray, plain `ray job submit` configured by `raystack env`, and a job whose py_executable has
  another Ray (this suite's venv) refused at submit with both versions named;
* on the first only (one is enough for the wheel's local path): `raystack up --local` and a job.

A venv is kept under the testbed's folder between local runs (only the wheel is reinstalled);
CI builds it fresh. The longer check over more versions: bench/ray_range.sh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ..conftest import TESTBED_DIR

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("2.54.0", "2.55.1")
SAYS_RAY = "import ray; ray.init(); print('RAY', ray.__version__, ray.cluster_resources().get('CPU'))"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO), "-w"]
    subprocess.run([*build, str(out)], check=True, cwd=out, capture_output=True)
    for junk in ("build", "raystack_slurm.egg-info"):  # (setuptools leaves them in the checkout)
        shutil.rmtree(REPO / junk, ignore_errors=True)
    [found] = out.glob("raystack_slurm-*.whl")
    return found


def venv_with(version: str, wheel: Path) -> Path:
    """A venv with Ray `version` and raystack from `wheel` (and their dependencies); its bin/."""
    root = TESTBED_DIR / "venvs" / f"ray-{version}"
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    has = (
        subprocess.run(
            [str(root / "bin" / "python"), "-c", "import ray; print(ray.__version__)"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if (root / "bin" / "python").exists()
        else ""
    )
    if has == version:
        done = subprocess.run(
            [*pip, "--no-deps", "--force-reinstall", str(wheel)], capture_output=True, text=True
        )
    else:
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        done = subprocess.run([*pip, str(wheel), f"ray[default]=={version}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "bin"


@pytest.fixture(scope="module")
def venvs(wheel: Path) -> dict[str, Path]:
    """Every version's venv, built side by side (CI builds them fresh: mostly downloads, so two at
    once take about as long as one)."""
    with ThreadPoolExecutor(len(VERSIONS)) as pool:
        return dict(zip(VERSIONS, pool.map(lambda version: venv_with(version, wheel), VERSIONS), strict=True))


def user(bin_dir: Path, home: Path) -> dict[str, str]:
    """A shell with that venv first on the PATH and nothing of this suite's Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTHON", "VIRTUAL_ENV"))}
    return {
        **env,
        "PATH": f"{bin_dir}:{env.get('PATH', '')}",
        "RAYSTACK_HOME": str(home),
        "VIRTUAL_ENV": str(bin_dir.parent),
    }


def run(env: dict[str, str], *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def home(testbed: Path) -> Iterator[Path]:
    folder = testbed / f"rs-range-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_wheel_on_an_older_ray_runs_a_cluster_and_its_jobs(
    version: str, venvs: dict[str, Path], home: Path
) -> None:
    env = user(venvs[version], home)
    done = run(env, "raystack", "--version")
    assert done.returncode == 0 and done.stdout.startswith("raystack "), done.stdout + done.stderr
    name = "r" + version.replace(".", "")
    try:
        up = run(env, "raystack", "up", "--nodes", "1", "--name", name, "--time", "10")
        assert up.returncode == 0 and " READY: " in up.stdout + up.stderr, up.stdout + up.stderr
        job = run(env, "raystack", "submit", "-c", name, "--follow", "--", "python", "-c", SAYS_RAY)
        assert job.returncode == 0 and f"RAY {version} 16.0" in job.stdout, job.stdout + job.stderr
        plain = run(
            {**env, **json.loads(run(env, "raystack", "env", name, "--json").stdout)},
            "ray",
            "job",
            "submit",
            "--",
            "python",
            "-c",
            "print('PLAIN', 6 * 7)",
        )
        assert plain.returncode == 0 and "PLAIN 42" in plain.stdout, plain.stdout + plain.stderr
        other = run(
            env,
            "raystack",
            "submit",
            "-c",
            name,
            "--set",
            f"runtime_env.py_executable={sys.executable}",
            "--",
            "python",
            "-c",
            "print(1)",
        )
        newest = run(
            {**os.environ}, sys.executable, "-c", "import ray; print(ray.__version__)"
        ).stdout.strip()
        assert other.returncode == 1 and other.stderr.count("\n") == 1, other.stderr
        assert f"{sys.executable} has Ray {newest} and the cluster runs Ray {version}" in other.stderr, (
            other.stderr
        )
    finally:
        run(env, "raystack", "down", name)
    if version != VERSIONS[0]:
        return
    try:
        up = run(env, "raystack", "up", "--local", "--cpus", "1", "--name", "lc")
        assert up.returncode == 0 and " READY: " in up.stdout + up.stderr, up.stdout + up.stderr
        job = run(env, "raystack", "submit", "-c", "lc", "--follow", "--", "python", "-c", SAYS_RAY)
        assert job.returncode == 0 and f"RAY {version} 1.0" in job.stdout, job.stdout + job.stderr
    finally:
        run(env, "raystack", "down", "lc")
