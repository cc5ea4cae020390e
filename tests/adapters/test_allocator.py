"""The backend's final word on an allocation (`allocator.ended`): what reconciliation trusts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from raystack.adapters import allocator
from raystack.adapters.allocator import Allocator, AllocInfo, AllocState, NodeFacts, Request, Script
from raystack.adapters.slurm import parse
from raystack.waiting import Clock


class Scripted(Allocator):
    """An allocator that answers `info` from a list, one answer per query (None: not asked)."""

    backend: ClassVar[Any] = "scripted"
    label: ClassVar[str] = "scripted job"
    remote: ClassVar[bool] = False

    def __init__(self) -> None:
        self.answers: list[str | None] = []
        self.asked = 0
        self.forgotten: list[str | None] = []

    def info(self, alloc_id: str) -> AllocInfo | None:
        self.asked += 1
        state = self.answers.pop(0)
        return None if state is None else parse.answer(alloc_id, state)

    def forget(self, alloc_id: str | None = None) -> None:
        self.forgotten.append(alloc_id)

    def submit(self, script: Path, request: Request) -> str:
        raise NotImplementedError

    def render(self, script: Script) -> str:
        raise NotImplementedError

    def facts(self, env: Mapping[str, str]) -> NodeFacts | None:
        return None

    def cancel(self, alloc_id: str) -> None:
        raise NotImplementedError

    def hosts(self, alloc_id: str, nodelist: str) -> list[str]:
        raise NotImplementedError

    def why_ended(self, info: AllocInfo) -> tuple[str, str]:
        raise NotImplementedError


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    one = Scripted()
    allocator.register(one)
    yield one
    allocator.ALLOCATORS.pop("scripted")


@pytest.mark.parametrize(
    ("answers", "final"),
    [
        (["RUNNING"], None),
        (["PENDING"], None),
        ([None], None),  # SLURM could not be asked: never an answer
        (["TIMEOUT"], "TIMEOUT"),
        (["GONE", "GONE"], "GONE"),
        (["GONE", "RUNNING"], None),  # (a moment between squeue and sacct)
        (["GONE", None], None),
        (["GONE", "COMPLETED"], "COMPLETED"),
    ],
)
def test_only_a_final_answer_ends_an_allocation(
    scripted: Scripted, answers: list[str | None], final: str | None
) -> None:
    scripted.answers = list(answers)
    slept: list[float] = []
    got = allocator.ended("scripted", "12", clock=Clock(sleep=slept.append))
    assert (got.native if got else None) == final
    assert scripted.asked == len(answers) and not scripted.answers
    gone_first = answers[0] == "GONE"
    assert slept == ([allocator.CONFIRM_GONE_AFTER] if gone_first else [])
    assert scripted.forgotten == (["12"] if gone_first else [])  # (asked again, not from a cache)


def test_an_answer_in_hand_saves_the_query(scripted: Scripted) -> None:
    slept: list[float] = []
    got = allocator.ended("scripted", "12", parse.answer("12", "NODE_FAIL"), clock=Clock(sleep=slept.append))
    assert (
        got is not None
        and got.native == "NODE_FAIL"
        and got.state is AllocState.ENDED
        and scripted.asked == 0
        and not slept
    )
