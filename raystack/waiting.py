"""One way to wait: a clock that tests can drive, back-off, rate gates, polling with a deadline,
and the guard that keeps a long-lived loop alive through a failing duty.

Every wait of raystack goes through here, with the clock passed in, so each has fast tests on a
`FakeClock` (time moves only when the code sleeps): `until` is the one polling loop (the node
programs' main loops, the client's waits for a cluster, a job or its log), `retry` the one loop
of bounded tries. No other module sleeps or loops around a sleep (tests/test_layout.py).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from raystack.errors import RaystackError

T = TypeVar("T")


@dataclass
class Clock:
    """Monotonic time and sleep; the real ones by default."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], object] = time.sleep  # (or an Event's wait: it ends a pause early)


REAL = Clock()


class FakeClock(Clock):
    """A clock for tests and simulations: `sleep` moves time forward at once."""

    def __init__(self, start: float = 1000.0):
        self.t = start
        super().__init__(now=lambda: self.t, sleep=self.advance)

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class Every:
    """A gate that opens at most every `seconds` (open on the first call unless `first=False`)."""

    def __init__(self, seconds: float, clock: Clock = REAL, first: bool = True):
        self.seconds, self.clock = seconds, clock
        self.last = -float("inf") if first else clock.now()

    def __call__(self) -> bool:
        if self.clock.now() - self.last < self.seconds:
            return False
        self.last = self.clock.now()
        return True

    def due_in(self) -> float:
        return max(0.0, self.last + self.seconds - self.clock.now())


@dataclass
class Backoff:
    """Delays that double from `first` up to `cap`, each shortened by up to `jitter` (a fraction)
    so that processes that failed together do not retry together; `reset()` after a success."""

    first: float = 1.0
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5
    rng: Callable[[], float] = field(default=random.random, repr=False)
    attempt: int = 0

    def next(self) -> float:
        delay = min(self.cap, self.first * self.factor**self.attempt)
        self.attempt += 1
        return delay * (1 - self.jitter * self.rng())

    def reset(self) -> None:
        self.attempt = 0


def until(
    step: Callable[[], T | None],
    every: float | Callable[[], float],
    clock: Clock = REAL,
    timeout: float | None = None,
    expired: Callable[[], BaseException] | None = None,
) -> T:
    """The polling loop: call `step` until it returns something other than None, and return that.
    Between calls sleep `every` seconds (a function: each next delay). After `timeout` seconds
    (None: no limit) raise `expired()` (by default a RaystackError). `step` ends the wait early by
    raising."""
    deadline = None if timeout is None else clock.now() + timeout
    while (value := step()) is None:
        if deadline is not None and clock.now() > deadline:
            raise expired() if expired else RaystackError(f"timed out after {timeout:.0f}s")
        clock.sleep(every() if callable(every) else every)
    return value


def at_most(
    step: Callable[[], T | None], every: float, clock: Clock = REAL, timeout: float = 0.0
) -> T | None:
    """`until` that gives up quietly: the step's value, or None after `timeout` seconds (for a
    wait on others, say every node's answer, where the caller goes on with those that came)."""

    class Late(Exception):
        pass

    try:
        return until(step, every, clock, timeout, Late)
    except Late:
        return None


def retry(
    attempt: Callable[[int], T | None], tries: int, every: float | Callable[[], float], clock: Clock = REAL
) -> T | None:
    """Call `attempt(0)`, `attempt(1)`, ... until one returns something other than None (returned),
    at most `tries` times, sleeping `every` seconds (a function: each next delay) between two tries;
    None when none did (without a sleep after the last)."""
    count = iter(range(max(1, tries)))

    def step() -> tuple[T | None] | None:
        n = next(count)
        value = attempt(n)
        if value is not None or n + 1 >= tries:
            return (value,)
        return None

    return until(step, every, clock)[0]


def poll_until(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    clock: Clock = REAL,
    interval: float = 0.05,
    max_interval: float = 0.25,
    abort: Callable[[], str | None] | None = None,
) -> T:
    """Poll `condition` until it returns a truthy value, and return it. Raises RaystackError after
    `timeout` seconds, or at once when `abort` returns a reason."""
    delays = Backoff(first=interval, cap=max_interval, factor=1.5, jitter=0.0)

    def step() -> T | None:
        value = condition()
        if not value and abort is not None and (why := abort()):
            raise RaystackError(f"{why} while waiting for {what}")
        return value or None

    def late() -> RaystackError:
        return RaystackError(f"timed out after {timeout:.0f}s waiting for {what}")

    return until(step, delays.next, clock, timeout, late)


class Guarded(Generic[T]):
    """A periodic duty of a long-lived loop that must never end the loop: an exception is logged
    (the first with its traceback, then every 10th) and the duty backs off (doubling up to `cap`
    seconds) before it runs again; the first success after failures is logged too.

    Periodic I/O on a shared filesystem meets ENOSPC, EDQUOT, EIO and ESTALE; a State API call
    meets a busy dashboard: none of them is a reason to end an allocation."""

    def __init__(
        self,
        name: str,
        duty: Callable[[], T],
        log: logging.Logger,
        clock: Clock = REAL,
        cap: float = 60.0,
    ):
        self.name, self.duty, self.log, self.clock = name, duty, log, clock
        self.backoff = Backoff(first=1.0, cap=cap)
        self.failures = 0
        self.resume_at = -float("inf")
        self.last_error = ""

    def __call__(self) -> T | None:
        if self.clock.now() < self.resume_at:
            return None
        try:
            value = self.duty()
        except Exception as exc:
            self.failures += 1
            delay = self.backoff.next()
            self.resume_at = self.clock.now() + delay
            self.last_error = f"{type(exc).__name__}: {exc}"
            if self.failures == 1:
                self.log.warning("%s failed (retrying in %.0fs): %s", self.name, delay, exc, exc_info=True)
            elif self.failures % 10 == 0:
                self.log.warning("%s failed %d times; last: %s", self.name, self.failures, self.last_error)
            return None
        if self.failures:
            self.log.info("%s works again after %d failure(s)", self.name, self.failures)
            self.failures, self.last_error = 0, ""
            self.backoff.reset()
        return value


def within(timeout: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Run `fn` on a thread; False if it did not return within `timeout` s (it is abandoned:
    a submit whose packaging blocks must not stop the queue). Its exception is raised here."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            fn(*args, **kwargs)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="submit", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return False
    if "error" in box:
        raise box["error"]
    return True


class Repeats:
    """A failure that comes back on every pass of a loop, in its log: the first of a kind at once,
    the same again at most once a minute with how many there were, and the end of the run of
    failures. (A full filesystem failed every runner pass, a second apart: 19 lines in 40 s into
    a log on that same filesystem.)"""

    EVERY = 60.0  # seconds between two lines of the same failure

    def __init__(self, clock: Callable[[], float], log: logging.Logger, what: str):
        self.clock, self.log, self.what = clock, log, what
        self.last: str | None = None
        self.count = 0  # failures since the last line said
        self.said_at = 0.0

    def failed(self, why: str) -> None:
        now = self.clock()
        if why != self.last:
            self.log.warning("%s failed, retrying: %s", self.what, why)
            self.last, self.count, self.said_at = why, 0, now
        elif now - self.said_at >= self.EVERY:
            n, took = self.count + 1, now - self.said_at
            self.log.warning("%s failed %d more time(s) in %.0fs, retrying: %s", self.what, n, took, why)
            self.count, self.said_at = 0, now
        else:
            self.count += 1

    def over(self) -> None:
        if self.last is not None:
            self.log.info("%s succeeds again (the last failure: %s)", self.what, self.last)
            self.last, self.count = None, 0
