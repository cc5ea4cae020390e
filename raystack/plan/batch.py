"""Effective batch = processes x micro-batch x gradient accumulation steps.

Moving a run to another GPU count changes the effective batch unless the gradient accumulation
changes with it (the BRTX RLCR run: 1 x 8 x 64 = 512 on one GPU -> 4 x 8 x 16 = 512 on four; on six,
512 / 48 is not whole: 11 steps give 528, 3.1% over, the nearest). Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class BatchPlan:
    processes: int
    micro_batch: int
    grad_accum: int
    target: int  # the effective batch to keep

    @property
    def effective(self) -> int:
        return self.processes * self.micro_batch * self.grad_accum

    @property
    def difference(self) -> float:
        """Relative difference from the target (0.031 = 3.1% larger)."""
        return (self.effective - self.target) / self.target

    @property
    def exact(self) -> bool:
        return self.effective == self.target

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "effective": self.effective,
            "difference": self.difference,
            "exact": self.exact,
        }


def keep_effective_batch(
    old_processes: int, old_micro: int, old_accum: int, new_processes: int, new_micro: int | None = None
) -> BatchPlan:
    """The gradient accumulation on `new_processes` closest to the old effective batch (the
    smaller difference wins; at least 1)."""
    for name, value in (
        ("old processes", old_processes),
        ("old micro-batch", old_micro),
        ("old accumulation", old_accum),
        ("new processes", new_processes),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    micro = new_micro or old_micro
    target = old_processes * old_micro * old_accum
    per_step = new_processes * micro
    low = max(1, target // per_step)
    options = [BatchPlan(new_processes, micro, a, target) for a in (low, low + 1)]
    return min(options, key=lambda p: (abs(p.difference), p.grad_accum))
