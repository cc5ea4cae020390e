"""Durations, read one way everywhere (SLURM's time forms among them): `--time` values a user writes, the
time limits squeue prints, and every timeout, grace period and interval of a spec or profile.

SLURM (sbatch(1), `--time`) takes "minutes", "minutes:seconds", "hours:minutes:seconds",
"days-hours", "days-hours:minutes" and "days-hours:minutes:seconds": after a day count the first
number is hours, so `1-2` is 1 day 2 hours (93,600 s), never 1 day 2 minutes.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

from raystack.errors import ConfigError

FORMAT = re.compile(r"(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)")


def seconds(text: str) -> int:
    """Seconds in a SLURM time; ValueError for anything else (UNLIMITED, 2h, 1:2:3:4)."""
    match = FORMAT.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a SLURM time (minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S)")
    d, dh, dm, ds, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if d is not None:  # D-H[:M[:S]]
        return d * 86400 + (dh or 0) * 3600 + (dm or 0) * 60 + (ds or 0)
    if c is not None:  # H:M:S
        return (a or 0) * 3600 + (b or 0) * 60 + c
    if b is not None:  # M:S
        return (a or 0) * 60 + b
    return (a or 0) * 60  # M


# A duration with units: 90s, 30m, 2h, 1d, 1h30m, 1.5h, "2 hours".
UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)")
DURATION_HELP = "minutes, or SLURM's M:S, H:M:S, D-H, D-H:M, D-H:M:S, or 90s, 30m, 2h, 1d"


def duration(value: object) -> float:
    """Seconds in a duration, read the same way for every duration raystack takes (walltime,
    timeouts, grace periods): a bare number is minutes, as in SLURM's --time; SLURM's forms
    (`30`, `30:00`, `2:00:00`, `1-12`, `1-12:30`, `1-12:30:00`) and units (`90s`, `30m`, `2h`,
    `1d`, `1h30m`, `1.5h`). ValueError for anything else (negative, not finite, a bool)."""
    if isinstance(value, bool):  # (YAML reads yes, no, on, off as booleans)
        raise ValueError(f"{str(value).lower()} is a yes/no, not a duration; use {DURATION_HELP}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value!r} is not a duration; use {DURATION_HELP}")
        return float(value) * 60
    text = str(value).strip().lower()
    if FORMAT.fullmatch(text):
        return float(seconds(text))
    if re.fullmatch(r"\d+\.\d+|\.\d+", text):
        return float(text) * 60
    total, end = 0.0, 0
    for match in _PART.finditer(text):
        if match.start() != end or match.group(2) not in UNITS:
            break
        total, end = total + float(match.group(1)) * UNITS[match.group(2)], match.end()
    if not text or end != len(text):
        raise ValueError(f"{value!r} is not a duration; use {DURATION_HELP}")
    return total


def dhms_text(secs: float) -> str:
    """A duration as SLURM's --time wants it: H:MM:SS, or D-HH:MM:SS from a day on (whole
    seconds, rounded up: SLURM would otherwise round a part minute down)."""
    s = math.ceil(secs)
    d, h, m, sec = s // 86400, s % 86400 // 3600, s % 3600 // 60, s % 60
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}" if d else f"{h}:{m:02d}:{sec:02d}"


def time_to_seconds(value: str | float) -> int:
    """Seconds in a walltime (any form `parse_duration` reads)."""
    return round(duration(value))


class ParsedText(str):
    """Text a person wrote, read once where it is loaded: the text stays as written (what is shown
    and saved) and the subclass's `__new__` keeps what it means beside it. A model field of such a
    type parses what it is given; a value put in with `model_copy(update=...)` must be one itself."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls, serialization=core_schema.to_string_ser_schema()
        )


class Walltime(ParsedText):
    """A walltime read once: the text sbatch's --time gets (SLURM's own text kept as written, a
    duration with units such as 2h or 1d12h turned into SLURM's D-HH:MM:SS) with its `.seconds`.
    0, off and UNLIMITED are refused (ValueError)."""

    seconds: int

    def __new__(cls, value: str | float) -> Walltime:
        text = str(value).strip()
        seconds = parse_duration(value)
        self = super().__new__(cls, text if FORMAT.fullmatch(text) else dhms_text(seconds))
        self.seconds = round(seconds)
        return self


def validate_time(value: str | float, field: str = "--time") -> Walltime:
    """A walltime a person gave (`up -t`): ConfigError naming `field` when it is not one."""
    try:
        return Walltime(value)
    except ValueError as exc:
        raise ConfigError(f"{field}: {exc}") from None


MAX_DURATION = 365 * 86400.0  # seconds: anything longer is a typo (and overflows timers)
OFF = ("off", "none", "never")


def parse_duration(
    value: int | float | str, limit: float = MAX_DURATION, off: bool = False, least: float = 0.0
) -> float:
    """Seconds in a duration: every duration raystack takes is read by `duration` (a
    bare number is minutes, as in SLURM; 90s, 30m, 2h, 1d; SLURM's M:S, H:M:S, D-H[:M[:S]]).
    0 (and off/none/never) means off where `off` allows it, and is refused elsewhere."""
    if value is False and off:  # (YAML reads a bare off or no as false)
        return 0.0
    if isinstance(value, str) and value.strip().lower() in OFF:
        if off:
            return 0.0
        raise ValueError(f"{value!r} cannot be off here; give a duration such as 30m")
    seconds = duration(value)
    if seconds == 0 and not off:
        raise ValueError(f"{value!r} is no time at all; give a duration such as 30m or 24:00:00")
    if 0 < seconds < least:
        raise ValueError(f"{value!r} is less than {duration_text(least)}")
    if seconds > limit:
        raise ValueError(
            f"{value!r} is over the limit of {duration_text(limit)}; give less, e.g. {example(limit)}"
        )
    return seconds


def example(limit: float) -> str:
    """A round duration well within `limit`, for a message: 12h within a day, 30d within a year."""
    for text, seconds in (("30d", 30 * 86400), ("3d", 3 * 86400), ("12h", 43200), ("30m", 1800), ("30s", 30)):
        if seconds <= limit:
            return text
    return "1s"


def off_or_duration(value: Any, limit: float = MAX_DURATION) -> float | None:
    """A duration where 0, off, none and never mean off (None); None stays None (unset)."""
    if value is None:
        return None
    return parse_duration(value, limit, off=True) or None


def duration_text(seconds: float) -> str:
    """90 -> '1m30s', 1800 -> '30m', 5400 -> '1h30m'; from two days on, days and hours:
    '3d4h' (a start estimate a year away is not 8759h59m)."""
    s = round(seconds)
    h, m, sec = s // 3600, s % 3600 // 60, s % 60
    if h >= 48:
        return f"{h // 24}d" + (f"{h % 24}h" if h % 24 else "")
    text = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec and not h else "")
    return text or "0s"
