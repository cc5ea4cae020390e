"""A non-editable install works on its own: built-in profiles are package data, and the CLI
plans an allocation from a folder that is not the repository."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel and installed (no dependencies: those of the venv serve)."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        str(REPO),
        "-w",
        str(tmp),
    ]
    subprocess.run(build, check=True, cwd=tmp)
    [wheel] = tmp.glob("raystack_slurm-*.whl")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
    )
    return site


def run(site: Path, cwd: Path, *code: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "XDG_CONFIG_HOME": str(cwd / "cfg"),
        "RAYSTACK_HOME": str(cwd / "home"),
    }
    return subprocess.run(
        [sys.executable, *code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_wheel_ships_the_builtin_profiles(installed: Path, tmp_path: Path) -> None:
    done = run(
        installed,
        tmp_path,
        "-c",
        "import raystack, raystack.spec.profile as p; print(raystack.__file__); "
        "print(sorted(p.available_profiles())); print(p.load_profile('isambard').gpus_per_node)",
    )
    assert done.returncode == 0, done.stderr
    where, names, gpus = done.stdout.splitlines()
    assert where.startswith(str(installed))  # the installed copy, not the repository
    assert {"generic", "isambard", "brtx", "supercloud", "testbed"} <= set(ast.literal_eval(names))
    assert gpus == "4"


def test_installed_cli_plans_an_allocation(installed: Path, tmp_path: Path) -> None:
    argv = [
        "-m",
        "raystack.cli",
        "up",
        "--nodes",
        "2",
        "--profile",
        "isambard",
        "--cpus-per-task",
        "72",
        "--dry-run",
    ]
    done = run(installed, tmp_path, *argv)
    assert done.returncode == 0, done.stderr
    assert "--gpus-per-node=4" in done.stdout and "module load cuda/12.6" in done.stdout


def test_python_dash_m_raystack_is_the_command(installed: Path, tmp_path: Path) -> None:
    done = run(installed, tmp_path, "-m", "raystack", "--version")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    # The distribution is raystack-slurm (`raystack` on the registry is another project); its
    # version comes from git (a tag, else 0.1.devN+g<commit>), never the source tree's 0.0.0.
    [meta] = installed.glob("raystack_slurm-*.dist-info")
    version = meta.name.removeprefix("raystack_slurm-").removesuffix(".dist-info")
    assert done.stdout.strip() == f"raystack {version}" and not version.startswith("0.0.0"), done.stdout
    bad = run(installed, tmp_path, "-m", "raystack", "logs", "../cluster")
    assert bad.returncode == 1 and bad.stderr.startswith("raystack: error: ") and bad.stderr.count("\n") == 1


def test_the_wheel_ships_the_examples_and_examples_copies_them(installed: Path, tmp_path: Path) -> None:
    """A user who installed the wheel has something to try: `raystack examples DIR` copies the
    debug jobs (each spec with its script) out of the installed package, and `check` takes one."""
    done = run(installed, tmp_path, "-m", "raystack.cli", "examples", str(tmp_path / "ex"))
    assert done.returncode == 0, done.stderr
    copied = {p.name for p in (tmp_path / "ex").iterdir()}
    assert {"hello.yaml", "hello.py", "spmd.yaml", "spmd.py", "zero3.yaml", "ds_config.json"} <= copied
    # Against the node size a user gives: whether this machine's SLURM answers sinfo is not the question.
    spec = str(tmp_path / "ex" / "hello.yaml")
    size = ["--gpus-per-node", "0", "--cpus-per-node", "4"]
    checked = run(installed, tmp_path, "-m", "raystack.cli", "check", spec, *size)
    assert checked.returncode == 0 and "ok:" in checked.stdout, checked.stderr
    again = run(installed, tmp_path, "-m", "raystack.cli", "examples", str(tmp_path / "ex"))
    assert again.returncode == 1 and "--force" in again.stderr
