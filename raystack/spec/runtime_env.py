"""A job's Ray runtime_env, resolved on the submitter's side before anything is queued.

Local paths (working_dir, py_modules) are made absolute from the spec's folder and checked as a
working_dir is (a folder within Ray's upload limit, no FIFO or socket in it, not holding
RAYSTACK_HOME); remote URIs (s3://, gs://, https://...) pass as they are. A `pip`/`uv`
requirements file or a conda environment file is read here, where the spec is: the queue runner
submits from the head node, where a relative path would mean something else. Ray's own
RuntimeEnv class then validates the whole, so its rules need no copy here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raystack.errors import ConfigError
from raystack.spec import workdir
from raystack.store import paths

# What raystack takes from a runtime_env into its own fields (the rest goes to Ray as given).
OWN_KEYS = ("working_dir", "env_vars", "excludes")


@dataclass
class Resolved:
    """A spec's working_dir, excludes and env joined with its runtime_env's; the rest of it."""

    working_dir: str | None
    excludes: list[str]
    env: dict[str, str]
    runtime_env: dict[str, Any] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # of the working_dir, by the defaults


def expand(path: str) -> str:
    """~ and $VARS in a path, as the submitter's shell would expand them."""
    return os.path.expandvars(os.path.expanduser(path))


def remote(value: str) -> bool:
    return "://" in value


def local_folder(value: str, base: Path, excludes: list[str], source: str, what: str) -> workdir.Upload:
    """A folder uploaded to every node: absolute, existing, within Ray's limits, neither holding
    RAYSTACK_HOME nor inside its clusters' folders (their tokens, ledgers and queues)."""
    folder = (base / expand(value)).resolve()
    if not folder.is_dir():
        start = "" if Path(expand(value)).is_absolute() else f": relative paths start at {base}"
        resolved = "" if str(folder) == value else f" ({folder}{start})"
        raise ConfigError(f"{source}: {what} '{value}' is not a folder{resolved}; fix the path")
    home = paths.home().resolve()
    if folder == home or folder in home.parents:
        raise ConfigError(
            f"{source}: {what} {folder} holds RAYSTACK_HOME ({home}), the clusters' tokens among "
            "it: choose a folder that does not, or move RAYSTACK_HOME out of it"
        )
    kept = paths.clusters_dir().resolve()
    if folder == kept or kept in folder.parents:
        raise ConfigError(
            f"{source}: {what} {folder} is in RAYSTACK_HOME's clusters folder ({kept}), where the "
            "clusters' tokens, ledgers and queues are: give your project's folder"
        )
    return workdir.check(folder, excludes, source)


def module(value: Any, base: Path, excludes: list[str], source: str) -> str:
    """One py_modules entry: a remote URI, a local package folder, or a local .whl/.zip file."""
    if not isinstance(value, str):
        raise ConfigError(f"{source}: runtime_env.py_modules: {value!r} is not a path or a URI")
    if remote(value):
        return value
    path = (base / expand(value)).resolve()
    if path.is_dir():
        return str(local_folder(value, base, excludes, source, "runtime_env.py_modules").root)
    if not path.is_file():
        resolved = "" if str(path) == value else f" ({path})"  # (where a relative one was looked for)
        raise ConfigError(f"{source}: runtime_env.py_modules: no file or folder {value!r}{resolved}")
    if path.suffix not in (".whl", ".zip"):
        raise ConfigError(f"{source}: runtime_env.py_modules: {value!r}: give a folder, a .whl or a .zip")
    return str(path)


def requirements(value: Any, base: Path, source: str, key: str) -> Any:
    """A pip/uv requirements file named by its path becomes its list of requirements."""
    if isinstance(value, dict) and isinstance(value.get("packages"), str):
        return {**value, "packages": requirements(value["packages"], base, source, key)}
    if not isinstance(value, str):
        return value
    path = (base / expand(value)).resolve()
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(
            f"{source}: runtime_env.{key}: cannot read the requirements file {path} ({exc.strerror}); "
            f"give a list of packages or a file that exists"
        ) from None
    return [ln.split(" #")[0].strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def conda(value: Any, base: Path, source: str) -> Any:
    """A conda environment file (.yml/.yaml) is read here; an environment's name passes."""
    if not (isinstance(value, str) and value.endswith((".yml", ".yaml"))):
        return value
    path = (base / expand(value)).resolve()
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: runtime_env.conda: cannot read {path} ({exc})") from None


def resolve(
    working_dir: str | None,
    excludes: list[str],
    env: dict[str, str],
    renv: dict[str, Any],
    base: Path,
    source: str,
) -> Resolved:
    """The spec's own fields joined with its runtime_env's, every local path checked, then the
    whole validated by Ray's RuntimeEnv. Raises ConfigError naming the key and the fix."""
    excludes = [*excludes, *renv.get("excludes", [])]
    folder = working_dir if working_dir is not None else renv.get("working_dir")
    left_out: dict[str, str] = {}
    if folder is not None and not remote(str(folder)):
        upload = local_folder(str(folder), base, excludes, source, "working_dir")
        folder, left_out = str(upload.root), upload.left_out
    rest = {k: v for k, v in renv.items() if k not in OWN_KEYS}
    if "py_modules" in rest:
        if not isinstance(rest["py_modules"], list):
            raise ConfigError(f"{source}: runtime_env.py_modules must be a list of folders, files or URIs")
        rest["py_modules"] = [module(m, base, excludes, source) for m in rest["py_modules"]]
    for key in ("pip", "uv"):
        if key in rest:
            rest[key] = requirements(rest[key], base, source, key)
    if "conda" in rest:
        rest["conda"] = conda(rest["conda"], base, source)
    joined = Resolved(folder, excludes, {**renv.get("env_vars", {}), **env}, rest, left_out)
    validate(joined, source)
    return joined


def validate(resolved: Resolved, source: str) -> None:
    """Ray's own RuntimeEnv on what Ray will be given (imported only when a job has one)."""
    if not resolved.runtime_env:
        return
    from ray.runtime_env import RuntimeEnv  # (heavy: only for a job that gives a runtime_env)

    whole = dict(resolved.runtime_env)
    if resolved.working_dir:
        whole["working_dir"] = resolved.working_dir
    if resolved.env:
        whole["env_vars"] = resolved.env
    try:
        RuntimeEnv(**whole)
    except (TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{source}: runtime_env: {first}") from None
