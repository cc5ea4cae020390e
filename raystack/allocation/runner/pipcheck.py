"""Before a job with a `pip` or `uv` runtime_env is submitted, the queue runner checks on the head
node that its packages can be had there, so a job whose nodes cannot reach a package index
fails in seconds with that reason instead of after Ray's setup timeout (10 minutes by default):

* with `--no-index` (wheels on the shared filesystem: `--find-links=/shared/wheels`), pip resolves
  the packages there (`pip install --dry-run`, offline and quick);
* otherwise the index (`--index-url`, `PIP_INDEX_URL`, or PyPI) must answer a TCP connection.

A `conda` runtime_env needs a conda where the cluster runs (Ray looks for it as the raylet starts
the job, in the node program's environment): without one the job fails with a traceback, so it
fails here with the fix instead. So does a `py_executable` that is not there (Ray would keep the
job PENDING for 15 minutes), and one, or a conda environment, with another Ray than the cluster's
(spec/rayenv.py: the submitter checks what it can see).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

from raystack.spec import rayenv

DEFAULT_INDEX = "https://pypi.org/simple"
CONNECT_TIMEOUT = 5.0  # seconds for the index to accept a connection
RESOLVE_TIMEOUT = 120.0  # seconds for pip to resolve the packages from local wheels


def packages_and_options(renv: dict[str, Any]) -> tuple[str, list[str], list[str]] | None:
    """('pip'|'uv', packages, install options) of a runtime_env, or None without either."""
    for key in ("pip", "uv"):
        value = renv.get(key)
        if value is None:
            continue
        if isinstance(value, list):
            return key, [str(v) for v in value], []
        if isinstance(value, dict):
            options = value.get("pip_install_options") or value.get("uv_pip_install_options") or []
            return key, [str(v) for v in value.get("packages") or []], [str(o) for o in options]
    return None


def index_of(options: list[str], env: dict[str, str]) -> str:
    for i, option in enumerate(options):
        if option in ("-i", "--index-url") and i + 1 < len(options):
            return options[i + 1]
        if option.startswith("--index-url="):
            return option.split("=", 1)[1]
    return env.get("PIP_INDEX_URL") or env.get("UV_INDEX_URL") or DEFAULT_INDEX


def reachable(url: str, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None when the index's host accepts a TCP connection; else why not."""
    parts = urlsplit(url)
    if parts.scheme == "file" or not parts.hostname:
        return None if os.path.exists(parts.path or url) else f"{url} does not exist here"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{parts.hostname}:{port} does not answer ({exc.strerror or exc})"


def runnable(path: str) -> bool:
    """An executable file (what Ray can start; a folder of that name is not)."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def conda_exe(env: dict[str, str]) -> tuple[str | None, str]:
    """The conda executable where Ray looks for one ($RAY_CONDA_HOME/bin/conda, else beside
    $CONDA_EXE, else `conda` on the PATH), and those words."""
    if env.get("RAY_CONDA_HOME"):
        exe = os.path.join(env["RAY_CONDA_HOME"], "bin", "conda")
        return exe, f"$RAY_CONDA_HOME/bin/conda, {exe}"
    if env.get("CONDA_EXE"):
        exe = os.path.join(os.path.dirname(env["CONDA_EXE"]), "conda")
        return exe, f"beside $CONDA_EXE, {exe}"
    return shutil.which("conda", path=env.get("PATH")), "`conda` on the PATH"


def conda_missing(renv: dict[str, Any], env: dict[str, str]) -> str | None:
    """Why a `conda` runtime_env cannot be set up here: no conda executable where Ray looks for
    one; or None."""
    if not renv.get("conda"):
        return None
    exe, source = conda_exe(env)
    if exe and runnable(exe):
        return None
    return (
        f"runtime_env conda: no conda on the nodes (Ray runs {source}): make it one of the cluster's "
        "(the profile's setup: [module load miniforge3], or env: {RAY_CONDA_HOME: /path/to/conda}; "
        "then raystack up again), or drop runtime_env.conda and run the env's own python "
        "(entrypoint: /path/to/env/bin/python ...)"
    )


def executable_missing(renv: dict[str, Any], env: dict[str, str]) -> str | None:
    """Why a `py_executable` cannot start Ray's workers here: a program given by its absolute
    path or by its name (looked up on the PATH) that is not there; None otherwise. (Ray would
    keep the job PENDING until its job start timeout, 15 minutes, and the queue behind it.) A
    relative path is the working_dir's (`.venv/bin/python`): not judged here."""
    value = renv.get("py_executable")
    try:
        program = shlex.split(str(value))[0] if value else ""
    except (ValueError, IndexError):
        return None
    if not program or ("/" in program and not os.path.isabs(program)):
        return None
    if runnable(program if "/" in program else shutil.which(program, path=env.get("PATH")) or ""):
        return None
    return (
        f"runtime_env py_executable: {program} is not a program on the nodes (no such file"
        f"{'' if '/' in program else ' on the PATH'}); give the path of a python there "
        "(e.g. /path/to/env/bin/python), or leave py_executable out"
    )


def other_ray(renv: dict[str, Any], env: dict[str, str]) -> str | None:
    """Why the job's py_executable or conda environment runs another Ray than this (the
    cluster's), asked here where the submitter could not (spec/rayenv.py), or None."""
    if not renv.get("py_executable") and not isinstance(renv.get("conda"), str):
        return None
    version = rayenv.installed()
    return rayenv.executable_fault(
        renv.get("py_executable"), version, False, env.get("PATH")
    ) or rayenv.conda_fault(renv.get("conda"), conda_exe(env)[0], version)


def key(renv: dict[str, Any]) -> str:
    """What `check` looks at in a runtime_env: equal keys, equal answers."""
    return json.dumps({k: renv.get(k) for k in ("pip", "uv", "conda", "py_executable")}, sort_keys=True)


def check(
    renv: dict[str, Any], python: str = sys.executable, env: dict[str, str] | None = None
) -> str | None:
    """Why this runtime_env cannot be set up on the nodes (its packages, conda, its python), or
    None."""
    env = dict(os.environ if env is None else env)
    if why := conda_missing(renv, env) or executable_missing(renv, env) or other_ray(renv, env):
        return why
    found = packages_and_options(renv)
    if found is None or not found[1]:
        return None
    key, packages, options = found
    if "--no-index" not in options:
        url = index_of(options, env)
        why = reachable(url)
        if why is None:
            return None
        return (
            f"runtime_env {key}: the nodes cannot reach the package index {url}: {why}; put wheels on the "
            f"shared filesystem and give {key}: {{packages: [...], pip_install_options: [--no-index, "
            "--find-links=/shared/wheels]}, or install them into the environment before raystack up"
        )
    command = [python, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check"]
    try:
        done = subprocess.run(
            [*command, *options, *packages],
            capture_output=True,
            text=True,
            timeout=RESOLVE_TIMEOUT,
            env={**env, "PIP_NO_INPUT": "1"},
        )
    except subprocess.TimeoutExpired:
        return f"runtime_env {key}: pip could not resolve {' '.join(packages)} within {RESOLVE_TIMEOUT:.0f}s"
    if done.returncode == 0:
        return None
    lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip().startswith("ERROR")]
    why = lines[0] if lines else (done.stderr.strip().splitlines() or ["pip failed"])[-1]
    return f"runtime_env {key}: {why} (pip {' '.join(options)})"
