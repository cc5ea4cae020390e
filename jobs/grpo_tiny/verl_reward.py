"""verl_reward: the "say d" reward in verl's custom reward function shape
(`custom_reward_function.path` / `.name` of verl's trainer config)."""

from __future__ import annotations

RESPONSE_LEN = 4  # (tiny.RESPONSE_LEN: verl loads this file alone, not the folder)


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """The share of the response's first words equal to the digit the prompt asked for."""
    words = solution_str.split()[:RESPONSE_LEN]
    return sum(1 for w in words if w == ground_truth) / RESPONSE_LEN
