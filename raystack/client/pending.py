"""What is said of an allocation SLURM holds back (PENDING): its reason and, once the scheduler
has made one, its start estimate; and when `wait` says it again."""

from __future__ import annotations

import time
from dataclasses import dataclass

from raystack.adapters.slurm import JobInfo
from raystack.slurmtime import duration_text


def expected_start(start: int | None, now: float, countdown: bool = True) -> str:
    """SLURM's start estimate of a PENDING allocation, said after its reason once the scheduler
    has made one: `, SLURM expects it to start at 14:05, in 2h10m`; '' without one."""
    if not start or start <= now:
        return ""
    when = time.strftime("%H:%M" if start - now < 20 * 3600 else "%a %d %b %H:%M", time.localtime(start))
    return f", SLURM expects it to start at {when}" + (
        f", in {duration_text(start - now)}" if countdown else ""
    )


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
