"""Copies this node's Ray logs into the cluster folder (logs/ray/<host>/) while Ray runs.

A thread passes over Ray's log folder every `Caps.every` seconds (and at once when the queue
runner asks: logs/ray/.sync), appending each file's new bytes to its capped copy
(store/raylogs.py); the node program makes a last pass at teardown, after Ray stopped and
before its temp dir is deleted. A node that dies abruptly has left everything up to its last
pass. Cheap on a shared filesystem: one listing and stat of the local folder per pass, writes
only of new bytes, at most a copy's cap read per file per pass.

Rotated files (Ray's raylet.out.1, ...) and files rewritten in place (debug_state*.txt) are
skipped; a dead worker's log that Ray moves to logs/old/ keeps its copy (same name).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from raystack.spec.profile import Caps
from raystack.store import paths
from raystack.store.files import atomic_write
from raystack.store.raylogs import ALLOCATION, REQUEST, SYNCED, CappedCopy, copy_parts
from raystack.waiting import Clock, until

log = logging.getLogger("raystack.node")
SKIP = re.compile(r"(\.\d+$|^debug_state)")  # rotated by Ray, or rewritten in place
CHUNK = 4 << 20  # bytes read at once
POLL = 1.0  # seconds between looks at the runner's request file
FINAL_BUDGET = 15.0  # seconds the teardown pass may take (SLURM's KillWait is often 30 s)


@dataclass
class Tracked:
    ino: int
    offset: int
    copy: CappedCopy


def session_logs(temp_dir: Path) -> Path:
    """Where Ray writes this node's logs (the drivers' output too, on the head)."""
    return temp_dir / "session_latest" / "logs"


class LogSync:
    """One node's copy of Ray's logs: `start()` the thread, `final()` at teardown."""

    def __init__(self, cluster: str, host: str, allocation: str, temp_dir: Path, caps: Caps):
        self.caps, self.allocation = caps, allocation
        self.src = session_logs(temp_dir)
        folder = paths.cluster(cluster)
        self.request = folder.ray_logs / REQUEST
        self.dest = folder.ray_host_logs(host)
        self.files: dict[str, Tracked] = {}
        self.total = 0  # bytes the copies take
        self.full = False  # the node's cap was reached (said once)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.last = 0.0  # when the last pass started

    def prepare(self) -> None:
        """Make logs/ray/<host>/ this allocation's: an earlier allocation's copies move into
        logs/ray/<host>/<its job id>/."""
        self.dest.mkdir(parents=True, exist_ok=True, mode=0o700)
        marker = self.dest / ALLOCATION
        try:
            previous = marker.read_text().strip()
        except OSError:
            previous = ""
        if previous and previous != self.allocation:
            older = self.dest / previous
            older.mkdir(exist_ok=True, mode=0o700)
            for entry in self.dest.iterdir():
                if entry.is_file() and entry.name != ALLOCATION:
                    os.replace(entry, older / entry.name)
            os.replace(marker, older / ALLOCATION)
        atomic_write(marker, self.allocation + "\n")
        self.total = sum(p.stat().st_size for p in copy_parts(self.dest))

    def start(self) -> LogSync:
        if not self.caps.on:
            return self
        try:
            self.prepare()
        except OSError as exc:
            log.warning("Ray's logs will not be copied to %s: %s", self.dest, exc)
            return self
        self.thread = threading.Thread(target=self._run, name="ray-logs", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        def one_pass() -> bool | None:
            if self.stop.is_set():
                return True
            due = self.caps.every > 0 and time.time() - self.last >= self.caps.every
            if due or self._asked():
                self.sync()
            return None

        # (passes POLL seconds apart; `final` sets stop, which ends the pause at once)
        self.stop.wait(POLL)
        until(one_pass, POLL, Clock(sleep=self.stop.wait))

    def _asked(self) -> bool:
        try:
            return self.request.stat().st_mtime > self.last
        except OSError:
            return False

    def final(self) -> None:
        """The teardown pass (Ray has stopped: its files are complete)."""
        if self.thread is None:
            return
        self.stop.set()
        self.thread.join(FINAL_BUDGET)
        if not self.thread.is_alive():
            self.sync(time.monotonic() + FINAL_BUDGET)
            log.info("Ray's logs of this node copied to %s (%.1f MB)", self.dest, self.total / 1e6)

    def sync(self, deadline: float | None = None) -> None:
        """One pass: every file's new bytes (the .err files and Ray's own first)."""
        with self.lock:
            self.last = time.time()
            try:
                for path in self._sources():
                    if deadline is not None and time.monotonic() > deadline:
                        break
                    self._copy(path)
                atomic_write(self.dest / SYNCED, f"{time.time():.3f}\n")
            except OSError as exc:  # a full or unreachable shared filesystem must not end the node
                log.warning("copying Ray's logs to %s: %s", self.dest, exc)

    def _sources(self) -> list[Path]:
        found: dict[str, Path] = {}
        for folder in (self.src / "old", self.src):  # (the live folder wins a name in both)
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if entry.is_file() and not SKIP.search(entry.name):
                    found[entry.name] = Path(entry.path)
        return sorted(
            found.values(), key=lambda p: (not p.name.endswith(".err"), p.name.startswith("worker"), p.name)
        )

    def _copy(self, path: Path) -> None:
        try:
            st = path.stat()
        except FileNotFoundError:  # moved to old/ between the listing and now: the next pass
            return
        tracked = self.files.get(path.name)
        if tracked is None:
            copy = CappedCopy(self.dest / path.name, self.caps.file_bytes)
            tracked = self.files[path.name] = Tracked(st.st_ino, 0, copy)
        elif tracked.ino != st.st_ino or st.st_size < tracked.offset:
            tracked.ino, tracked.offset = st.st_ino, 0  # replaced: a new file under the same name
        new = st.st_size - tracked.offset
        if new <= 0:
            return
        first, last = tracked.copy.plan(new)
        with open(path, "rb") as fh:
            fh.seek(tracked.offset)
            self._append(tracked, fh, tracked.offset, first)
            if last:
                fh.seek(st.st_size - last)
                self._append(tracked, fh, st.st_size - last, last)
        tracked.offset = st.st_size

    def _append(self, tracked: Tracked, fh: BinaryIO, at: int, count: int) -> None:
        while count > 0:
            data = fh.read(min(CHUNK, count))
            if not data:
                return
            grown = tracked.copy.append(data, at, self.caps.node_bytes - self.total)
            self.total += grown
            at, count = at + len(data), count - len(data)
            if self.total >= self.caps.node_bytes and not self.full:
                self.full = True
                log.warning(
                    "Ray's logs of this node reached the %g MB cap (profile ray_logs.node_mb): "
                    "files that grow further keep only what fits",
                    self.caps.node_mb,
                )
