"""Values shared by profiles and job specs: SLURM times, durations, sizes, environments, and YAML
loading. Every problem becomes one ConfigError line naming the file, the field and the fix.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raystack.errors import ConfigError

# SLURM's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?", re.IGNORECASE)
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


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
    if not _TIME.fullmatch(value) or time_to_seconds(value) <= 0:
        raise ConfigError(
            f"{field}: {value!r} is not a SLURM time; use minutes, HH:MM:SS or D-HH:MM:SS (e.g. 24:00:00)"
        )
    return value


def parse_duration(value: int | float | str) -> float:
    """Seconds from 90, '90s', '15m', '2h30m', '1d' or 'HH:MM:SS'."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{value} is negative; use a number of seconds or e.g. 2h")
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+:\d{1,2}:\d{1,2}", text):
        h, m, s = (int(p) for p in text.split(":"))
        return float(h * 3600 + m * 60 + s)
    match = _DURATION.fullmatch(text)
    if not text or not match:
        raise ValueError(f"{value!r} is not a duration; use seconds, 90s, 15m, 2h30m or HH:MM:SS")
    d, h, m, s = (int(g or 0) for g in match.groups())
    return float(d * 86400 + h * 3600 + m * 60 + s)


def validate_env(value: dict[str, Any]) -> dict[str, str]:
    """Environment of a profile or job spec: valid names, string values, no CUDA_VISIBLE_DEVICES."""
    for key in value:
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if key == "CUDA_VISIBLE_DEVICES" or key.startswith("RAY_EXPERIMENTAL_NOSET_"):
            raise ValueError(f"never set {key}: SLURM and Ray assign GPUs to each actor")
    return {k: str(v) for k, v in value.items()}


def size_to_mb(value: str | int) -> int:
    """'2GB', '512M', '1.5GiB' or a number of MB -> MB."""
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a size; use e.g. 512MB or 2GB")
    number, unit = float(match.group(1)), (match.group(2) or "M")[0].upper()
    return int(number * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit])


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
