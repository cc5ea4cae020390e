"""One Ray for the cluster and the job: a job whose Python environment has another Ray than the
cluster's fails in Ray's own words, late (a worker that cannot register with the raylet, a
protocol error, a job PENDING until Ray's setup timeout). raystack refuses it with both versions:

* at submit, from what the submitter can read: a `ray` requirement in runtime_env pip/uv (or the
  pip list of a conda environment given as a mapping) that the cluster's Ray does not satisfy;
  the `ray` of a uv project's uv.lock, for a job run with `uv run`; a runtime_env py_executable
  that is a file here (the shared filesystem), asked for its Ray;
* at start, on the head node (allocation/runner/pipcheck.py), for what only a node can tell: a
  py_executable not found here, or a conda environment by name.

A requirement that leaves `ray` unpinned (`pip: [ray]`) is no conflict: the cluster's Ray
satisfies it, and Ray's pip environments see the cluster's packages.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from raystack.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # (Python 3.10: the same parser, released apart)
    import tomli as tomllib

ASK_TIMEOUT = 60.0  # seconds for a python to say which Ray it has (importing ray takes 1-3 s)
ASK = "import importlib.metadata as m; print(m.version('ray'))"


# NOTE: Ray before 2.54 has CVE-2026-27482 (GHSA-q5fh-2hc8-f6rq): the dashboard's DELETE routes
# can be reached from a browser page. raystack starts its clusters with the Ray it is installed
# with; pyproject.toml asks for this floor too.
RAY_FLOOR = "2.54"


def installed() -> str:
    """The Ray of this Python environment (the cluster's, where the head or the `up` runs)."""
    return importlib.metadata.version("ray")


def check_floor(version: str | None = None) -> None:
    """Refuse to start a cluster on a Ray older than RAY_FLOOR (said with the CVE and the fix)."""
    found = version or installed()
    try:
        old = Version(found) < Version(RAY_FLOOR)
    except InvalidVersion:
        return
    if old:
        raise ConfigError(
            f"Ray {found} is installed here: Ray before {RAY_FLOOR} has CVE-2026-27482 (the dashboard's "
            f"DELETE routes reachable from a browser page); raystack starts clusters on Ray {RAY_FLOOR} "
            f"or newer: pip install 'ray[default]>={RAY_FLOOR}'"
        )


def requirements(renv: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, requirement text) of every package a runtime_env installs."""
    for key in ("pip", "uv"):
        value = renv.get(key)
        if isinstance(value, dict):
            value = value.get("packages")
        if isinstance(value, list):
            yield from ((f"runtime_env.{key}", str(v)) for v in value)
    conda = renv.get("conda")
    if isinstance(conda, dict):
        for dep in conda.get("dependencies") or []:
            if isinstance(dep, dict):
                yield from (("runtime_env.conda (pip)", str(v)) for v in dep.get("pip") or [])


def pinned_fault(renv: dict[str, Any], version: str) -> str | None:
    """Why a runtime_env's `ray` requirement does not admit the cluster's Ray `version`, or None."""
    for field, text in requirements(renv):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue  # (an option line, a URL, a path: pip judges those)
        if canonicalize_name(req.name) != "ray" or not req.specifier:
            continue
        if not req.specifier.contains(version, prereleases=True):
            return (
                f"{field}: {text} asks for another Ray than the cluster's ({version}): a job runs on the "
                f"cluster's Ray; leave ray out of the list (the cluster has it), or start the cluster "
                f"with a Ray that satisfies {req.specifier}"
            )
    return None


def uses_uv_run(entrypoint: str, uv: bool) -> bool:
    try:
        words = shlex.split(entrypoint)
    except ValueError:
        return uv
    return uv or words[:2] == ["uv", "run"]


def locked_ray(folder: Path) -> str | None:
    """The version of `ray` in a uv project's uv.lock (the folder's), or None."""
    try:
        lock = tomllib.loads((folder / "uv.lock").read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    for package in lock.get("package") or []:
        if isinstance(package, dict) and canonicalize_name(str(package.get("name", ""))) == "ray":
            return str(package.get("version") or "") or None
    return None


def same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def lock_fault(folder: Path | None, version: str) -> str | None:
    """Why a job run with `uv run` in `folder` gets another Ray than the cluster's, or None."""
    locked = locked_ray(folder) if folder is not None else None
    if locked is None or same(locked, version):
        return None
    return (
        f"uv run: {folder}/uv.lock locks Ray {locked} and the cluster runs Ray {version}: Ray's "
        f"workers would run another Ray than the cluster; `uv add 'ray[default]=={version}'` in "
        f"{folder}, or start the cluster with Ray {locked}"
    )


def python_ray(argv: list[str], timeout: float = ASK_TIMEOUT) -> tuple[str | None, str]:
    """(Ray's version, '') of the Python that `argv` starts; (None, why) where it has none or
    cannot say."""
    try:
        done = subprocess.run(
            [*argv, "-c", ASK],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
        )
    except subprocess.TimeoutExpired:
        return None, f"did not say which Ray it has within {timeout:.0f}s"
    except OSError as exc:
        return None, f"does not run ({exc.strerror or exc})"
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip().splitlines()[-1], ""
    if "PackageNotFoundError" in done.stderr:
        return None, "has no Ray (Ray's workers import ray there)"
    last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return None, f"fails: {last[:200]}"


def other_ray(argv: list[str], version: str) -> str | None:
    """`has Ray 2.55.0` (or why it cannot say) where the Python `argv` starts has another Ray than
    `version`; None where it has that one."""
    found, why = python_ray(argv)
    if found is not None and same(found, version):
        return None
    return f"has Ray {found}" if found is not None else why


def interpreter(value: Any) -> list[str] | None:
    """py_executable as a command to ask, where it names a Python (`/env/bin/python3 -X ...`);
    None for a launcher such as `uv run` or `nsys profile python`, which Ray starts otherwise."""
    try:
        words = shlex.split(str(value)) if value else []
    except ValueError:
        return None
    if not words or not Path(words[0]).name.startswith("python"):
        return None
    return words


def executable_fault(value: Any, version: str, here: bool, path: str | None = None) -> str | None:
    """Why a runtime_env py_executable runs another Ray than the cluster's `version`, or None.
    `here`: at submit, only a program that is a file on this machine is asked (the node asks the
    others at start, a name looked up on `path`); a relative path (the working_dir's) is not judged."""
    argv = interpreter(value)
    if argv is None or ("/" in argv[0] and not os.path.isabs(argv[0])):
        return None
    if here and not (os.path.isabs(argv[0]) and os.path.isfile(argv[0])):
        return None
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path)
    if program is None:
        return None  # (pipcheck says it is missing)
    has = other_ray([program, *argv[1:]], version)
    if has is None:
        return None
    return (
        f"runtime_env.py_executable: {argv[0]} {has} and the cluster runs Ray {version}: Ray's "
        f"workers need the cluster's Ray; install ray[default]=={version} there, or start the cluster "
        "from that environment"
    )


def submit_fault(
    renv: dict[str, Any], entrypoint: str, uv: bool, folder: Path | None, version: str
) -> str | None:
    """Every check the submitter can make (see the module's docstring)."""
    return (
        pinned_fault(renv, version)
        or (lock_fault(folder, version) if uses_uv_run(entrypoint, uv) else None)
        or executable_fault(renv.get("py_executable"), version, here=True)
    )


def conda_fault(name: Any, conda_exe: str | None, version: str) -> str | None:
    """Why a conda environment given by name (or by its folder) has another Ray than the
    cluster's, or None (where its folder is not found here, Ray says what it finds)."""
    if not isinstance(name, str) or not name or name.endswith((".yml", ".yaml")):
        return None
    if os.path.isabs(name):
        prefix = Path(name)
    elif conda_exe:
        prefix = Path(conda_exe).resolve().parent.parent / "envs" / name  # (<base>/bin/conda)
    else:
        return None
    python = prefix / "bin" / "python"
    if not python.is_file():
        return None
    has = other_ray([str(python)], version)
    if has is None:
        return None
    return (
        f"runtime_env.conda: environment {name} ({prefix}) {has} and the cluster runs Ray {version}: "
        f"Ray's workers need the cluster's Ray; conda install -p {prefix} ray-default={version} (or "
        f"pip install ray[default]=={version} in it), or start the cluster from that environment"
    )
