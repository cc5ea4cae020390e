"""Typed configuration: cluster profiles (and, later, job specs), validated when loaded.

Every validation problem becomes one ConfigError line naming the file, the field and the fix;
unknown keys list the valid ones.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from raystack.errors import ConfigError

# SLURM's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?$", re.IGNORECASE)

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILTIN_PROFILES = REPO_ROOT / "slurm" / "profiles"


def time_to_seconds(value: str) -> int:
    """Seconds in a SLURM --time value (validated with `validate_time` first)."""
    days, _, rest = value.rpartition("-") if "-" in value else ("0", "", value)
    parts = [int(p) for p in rest.split(":")]
    if "-" in value:  # D-H[:M[:S]]
        h, m, s = [*parts, 0, 0][:3]
    elif len(parts) == 1:  # M
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:  # M:S
        h, m, s = 0, parts[0], parts[1]
    else:
        h, m, s = parts
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def validate_time(value: str, field: str = "--time") -> str:
    value = str(value).strip()
    if not _TIME.match(value) or time_to_seconds(value) <= 0:
        raise ConfigError(
            f"{field}: {value!r} is not a SLURM time; use minutes, HH:MM:SS or D-HH:MM:SS (e.g. 24:00:00)"
        )
    return value


def validate_env(value: dict[str, Any]) -> dict[str, str]:
    """Environment of a profile or job spec: valid names, string values, no CUDA_VISIBLE_DEVICES."""
    for key in value:
        if not ENV_NAME.match(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if key == "CUDA_VISIBLE_DEVICES":
            raise ValueError("never set CUDA_VISIBLE_DEVICES: SLURM and Ray assign GPUs")
    return {k: str(v) for k, v in value.items()}


def size_to_mb(value: str | int) -> int:
    """'2GB', '512M', '1.5GiB' or a number of MB -> MB."""
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a size; use e.g. 512MB or 2GB")
    number, unit = float(match.group(1)), (match.group(2) or "M")[0].upper()
    return int(number * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit])


class Profile(BaseModel):
    """A cluster profile: sbatch defaults, environment setup and Ray node settings of a site."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "generic"
    description: str = ""
    # sbatch defaults
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    gpus_per_node: int = Field(default=0, ge=0, le=64)
    gpu_type: str | None = None  # e.g. "volta" -> --gpus-per-node=volta:2
    cpus_per_task: int | None = Field(default=None, ge=1)
    mem: str | None = None  # e.g. "0" (all of the node) or "200G"
    extra_sbatch: list[str] = Field(default_factory=list)
    # the allocation's environment
    setup: list[str] = Field(default_factory=list)  # shell lines run before Ray starts
    env: dict[str, str] = Field(default_factory=dict)
    # Ray on each node
    local_scratch: str = "/tmp"  # node-local folder for Ray's temp dir (sockets: keep it short)
    object_store_memory: str | None = None  # default: min(30% of RAM, half of /dev/shm)
    join_timeout: int = Field(default=300, ge=5)  # seconds for every node to join the head

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        try:
            return validate_time(value, "time")
        except ConfigError as exc:  # pydantic reports ValueErrors with the file and field
            raise ValueError(str(exc).removeprefix("time: ")) from None

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, Any]) -> dict[str, str]:
        return validate_env(value)

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for option in value:
            if not str(option).startswith("--"):
                raise ValueError(f"{option!r} must be a long sbatch option such as --exclusive")
        return value

    @field_validator("object_store_memory")
    @classmethod
    def _object_store(cls, value: str | None) -> str | None:
        if value is not None:
            size_to_mb(value)
        return value


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, the user's first: ~/.config/raystack/profiles, built-ins."""
    dirs = [Path(p) for p in os.environ.get("RAYSTACK_PROFILE_PATH", "").split(os.pathsep) if p]
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return [*dirs, config_home / "raystack" / "profiles", BUILTIN_PROFILES]


def available_profiles() -> list[str]:
    names = {p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def one_line_error(exc: ValidationError, source: str, valid: list[str]) -> str:
    """The most useful of pydantic's errors as one line: an unknown key (a typo) comes first."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][-1]), valid, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"{source}: unknown key '{where}'{hint}; valid keys: {', '.join(valid)}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] not in ("value_error", "assertion_error") and "input" in err:
        message += f" (got {err['input']!r})"
    return f"{source}: field '{where}': {message}"


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__}): fix the syntax") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of keys to values, got {type(data).__name__}")
    return data


def load_profile(name: str = "generic") -> Profile:
    """Load a profile by name (or path to a .yaml file)."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else None
    if path is None:
        path = next((d / f"{name}.yaml" for d in profile_dirs() if (d / f"{name}.yaml").is_file()), None)
    if path is None or not path.is_file():
        raise ConfigError(
            f"unknown profile '{name}': choose one of {', '.join(available_profiles())} "
            f"or add {profile_dirs()[-2]}/{name}.yaml"
        )
    data = load_yaml(path)
    data.setdefault("name", path.stem)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(one_line_error(exc, f"profile {path}", sorted(Profile.model_fields))) from exc
