"""LogTail's end: a short log is fetched whole at once (Ray closes a finished job's stream only
seconds later, which the next job of the queue would wait for); a long one waits for its stream."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from raystack.allocation.runner import logtail
from raystack.allocation.runner.logtail import LogTail
from raystack.store import raylogs


class SlowStream:
    """A Jobs API whose log stream sends `first`, then hangs until `release` (Ray's late close)."""

    def __init__(self, first: str, whole: str, fetch_fails: bool = False):
        self.first, self.whole, self.fetch_fails = first, whole, fetch_fails
        self.release = threading.Event()
        self.fetches = 0

    @property
    def jobs(self) -> SlowStream:
        return self

    async def tail_job_logs(self, sid: str):  # type: ignore[no-untyped-def]
        yield self.first
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        yield self.whole[len(self.first) :]

    def log_bounded(self, sid: str, limit: int) -> str | None:
        self.fetches += 1
        if self.fetch_fails:
            raise RuntimeError("dashboard busy")
        return self.whole if len(self.whole.encode()) <= limit else None


def started(api: SlowStream, path: Path) -> LogTail:
    tail = LogTail(api, "s1", path)
    deadline = time.monotonic() + 5
    while (not path.exists() or path.stat().st_size < len(api.first)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return tail


def test_a_short_log_is_completed_by_one_fetch_without_waiting_for_the_stream(tmp_path: Path) -> None:
    api = SlowStream("line 1\n", "line 1\nline 2 ü\nlast line\n")
    path = tmp_path / "job.log"
    tail = started(api, path)
    t0 = time.monotonic()
    tail.complete()
    assert time.monotonic() - t0 < 2 and api.fetches == 1
    api.release.set()  # the stream's late rest must not be written twice
    tail.thread.join(5)
    assert path.read_text() == api.whole


def test_a_failed_fetch_falls_back_to_the_stream(tmp_path: Path) -> None:
    api = SlowStream("line 1\n", "line 1\nlast line\n", fetch_fails=True)
    path = tmp_path / "job.log"
    tail = started(api, path)
    threading.Timer(0.3, api.release.set).start()
    tail.complete()
    assert path.read_text() == api.whole


def test_a_long_log_waits_for_its_stream(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(logtail, "FETCH_WHOLE_BELOW", 4)
    api = SlowStream("line 1\n", "line 1\nlast line\n")
    path = tmp_path / "job.log"
    tail = started(api, path)
    threading.Timer(0.3, api.release.set).start()
    tail.complete()
    assert api.fetches == 0 and path.read_text() == api.whole


def test_a_log_over_its_cap_keeps_its_start_and_its_end(tmp_path: Path) -> None:
    from raystack.store.raylogs import read_copy, read_from

    lines = "".join(f"line {i:06d}\n" for i in range(20000))  # 240 KB
    api = SlowStream(lines, lines)
    api.release.set()
    path = tmp_path / "job.log"
    tail = LogTail(api, "s1", path, cap=64 << 10)
    tail.thread.join(10)
    tail.complete()
    parts = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert parts <= 64 << 10  # the copy stays within its cap
    text = read_copy(path)
    assert text.startswith("line 000000\n") and text.endswith("line 019999\n") and "not kept" in text
    assert raylogs.last_line(path) == "line 019999"
    whole, end = read_from(path, 0)
    assert whole.decode() == text and end == len(lines)  # followed the same way, to the end


def test_a_lagging_stream_never_pulls_a_huge_log_into_memory(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(logtail, "FETCH_LIMIT", 1000)
    monkeypatch.setattr(logtail, "JOIN_TIMEOUT", 0.2)
    api = SlowStream("line 1\n", "line 1\n" + "x" * 5000 + "\n")  # the stream never sends the rest
    path = tmp_path / "job.log"
    tail = started(api, path)
    tail.complete()
    assert api.fetches >= 1 and "was not fetched" in path.read_text()


class NotUtf8:
    """Ray's log API on a driver's output that is not UTF-8: the stream sends what decodes and
    ends quietly; a fetch answers 500."""

    def __init__(self, decodable: str):
        self.decodable = decodable

    @property
    def jobs(self) -> NotUtf8:
        return self

    async def tail_job_logs(self, sid: str):  # type: ignore[no-untyped-def]
        yield self.decodable

    def log_bounded(self, sid: str, limit: int) -> str | None:
        raise RuntimeError("Request failed with status code 500: UnicodeDecodeError")


def test_output_that_is_not_utf8_is_taken_from_rays_own_file(tmp_path: Path) -> None:
    whole = (
        b"Running entrypoint for job s1: python bytes.py\nbad \xff\xfe bytes\n" + b"x" * 300_000 + b"\nend\n"
    )
    ray_file = tmp_path / "job-driver-s1.log"
    ray_file.write_bytes(whole)
    first = whole.split(b"bad")[0].decode()
    for start in (True, False):  # streamed, or ended before the runner saw it run
        path = tmp_path / f"job-{start}.log"
        tail = LogTail(NotUtf8(first), "s1", path, start=start, local=ray_file)
        if start:
            tail.thread.join(5)
        tail.complete()
        assert path.read_bytes() == whole
    path = tmp_path / "no-file.log"  # (no file of Ray's here: the note says where Ray's copy is)
    tail = LogTail(NotUtf8(first), "s1", path, local=tmp_path / "absent.log")
    tail.thread.join(5)
    tail.complete()
    assert path.read_bytes().startswith(first.encode())
