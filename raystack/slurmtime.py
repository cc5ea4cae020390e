"""SLURM's time format, read one way everywhere: `--time` values a user writes and the time
limits squeue prints.

SLURM (sbatch(1), `--time`) takes "minutes", "minutes:seconds", "hours:minutes:seconds",
"days-hours", "days-hours:minutes" and "days-hours:minutes:seconds": after a day count the first
number is hours, so `1-2` is 1 day 2 hours (93,600 s), never 1 day 2 minutes.
"""

from __future__ import annotations

import re

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
