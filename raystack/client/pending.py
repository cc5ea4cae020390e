"""What is said of an allocation SLURM holds back (PENDING): its reason and, once the scheduler
has made one, its start estimate; and when `wait` says it again."""

from __future__ import annotations

import time
from dataclasses import dataclass

from raystack.adapters.slurm import JobInfo
from raystack.slurmtime import duration_text


def pending_note(reason: str | None, expected_start: int | None, now: float, countdown: bool = True) -> str:
    """Why SLURM holds an allocation back and, once its scheduler has estimated one, when it
    expects to start it: `Resources; SLURM expects it to start at 14:05, in 2h10m`."""
    text = reason if reason and reason != "None" else "not scheduled yet"
    if not expected_start or expected_start <= now:
        return text
    when = time.strftime(
        "%H:%M" if expected_start - now < 20 * 3600 else "%a %d %b %H:%M", time.localtime(expected_start)
    )
    left = f", in {duration_text(expected_start - now)}" if countdown else ""
    return f"{text}; SLURM expects it to start at {when}{left}"


@dataclass
class PendingShown:
    """What `wait` last said of a PENDING allocation: said again when SLURM's reason changes or
    its start estimate moves by ESTIMATE_MOVES (backfill revises it often, by little)."""

    reason: str | None = None
    start: int = -1

    ESTIMATE_MOVES = 600  # seconds

    def moved(self, info: JobInfo) -> bool:
        if info.reason == self.reason and (
            info.start_time == self.start
            or (
                info.start_time and self.start > 0 and abs(info.start_time - self.start) < self.ESTIMATE_MOVES
            )
        ):
            return False
        self.reason, self.start = info.reason, info.start_time
        return True
