"""Ray's own logs in the cluster folder: they outlive the allocation (its temp dir is deleted).

Each node program copies its node's Ray log folder (raylet, GCS, dashboard, the workers'
worker-*.out/err and python-core-worker-*.log) into logs/ray/<host>/ while it runs and once more
at teardown (allocation/node/logsync.py). This module holds what both sides share: the capped copy of
one file, reading a copy back, and where the copies are. A job's view of them (its actors' worker
logs, and the first error among them) is workerlogs.py's.

A copy is only ever appended to (new bytes, never a recopy) and holds at most `cap` bytes:
  <name>         the first cap/2 bytes of the original (how it began)
  <name>.tail.1  the previous segment of its end       (each tail segment is at most cap/4
  <name>.tail    the latest segment of its end          and starts with its offset line)
so how a process started and how it died both survive a log of any size.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from raystack.store import paths
from raystack.store.files import atomic_write
from raystack.waiting import REAL, Clock, at_most

TAIL, PREV = ".tail", ".tail.1"
OFFSET = re.compile(rb"^\[raystack: from byte (\d+) of the original\]\n")
ALLOCATION = ".allocation"  # which allocation the files in logs/ray/<host>/ belong to
SYNCED = ".synced"  # when the node program last finished a copy (written after each pass)
REQUEST = ".sync"  # in logs/ray/: touched by the queue runner to ask every node for a pass now

ANSI = re.compile(r"\x1b\[[0-9;]*m")
RELAYED = re.compile(r"^\((?:[\w.:-]+ )?pid=\d+")  # a worker's line that Ray relays to the driver
# What Ray's job manager writes at the top of every driver log (the entrypoint it runs holds
# raystack's own prefix): never the job's last word.
PREAMBLE = re.compile(r"^Running entrypoint for job |\bINFO job_manager\.py:\d+ -- ")


# ---------------------------------------------------------------------------- one file's copy
class CappedCopy:
    """The copy of one growing file: its start, then the two newest segments of its end."""

    def __init__(self, path: Path, cap: int):
        self.path, self.cap = path, max(cap, 4096)
        self.head_cap, self.seg_cap = self.cap // 2, self.cap // 4
        self.head, self.tail, self.prev = (_size(p) for p in self.parts())
        self.next: int | None = None  # the original's offset after the last byte appended

    def parts(self) -> tuple[Path, Path, Path]:
        return self.path, _with(self.path, TAIL), _with(self.path, PREV)

    @property
    def footprint(self) -> int:
        return self.head + self.tail + self.prev

    @property
    def in_tail(self) -> bool:
        return self.head >= self.head_cap or self.tail > 0 or self.prev > 0

    def plan(self, new: int) -> tuple[int, int]:
        """Of `new` bytes the original grew by: how many to read from their start and how many
        from their end (those between would not be kept: they are never read)."""
        room = 0 if self.in_tail else self.head_cap - self.head
        end = 2 * self.seg_cap
        return (new, 0) if new <= room + end else (room, end)

    def append(self, data: bytes, at: int, allowance: int) -> int:
        """Append `data` (which starts at byte `at` of the original), growing the copy by at
        most `allowance` bytes; returns how much it grew (negative when a segment was dropped).
        Bytes the caps leave out are never written; a jump in `at` starts a new tail segment."""
        grown = 0
        if not self.in_tail:
            room = self.head_cap - self.head
            take = max(0, min(len(data), room, allowance))
            if take:
                with open(self.path, "ab") as fh:
                    fh.write(data[:take])
                self.head, grown = self.head + take, take
            if take < min(len(data), room):
                return grown  # the node's cap: the rest is not kept
            data, at, self.next = data[take:], at + take, at + take
        jump = self.next is not None and at != self.next
        while data:
            if self.tail == 0 or self.tail >= self.seg_cap or jump:
                jump = False
                if self.tail:  # rotate: the older segment goes, this one takes its place
                    os.replace(_with(self.path, TAIL), _with(self.path, PREV))
                    grown -= self.prev
                    self.prev, self.tail = self.tail, 0
                header = b"[raystack: from byte %d of the original]\n" % at
                if grown + len(header) > allowance:
                    return grown
                with open(_with(self.path, TAIL), "wb") as fh:
                    fh.write(header)
                self.tail, grown = len(header), grown + len(header)
            take = max(0, min(len(data), self.seg_cap - self.tail, allowance - grown))
            if not take:
                return grown
            with open(_with(self.path, TAIL), "ab") as fh:
                fh.write(data[:take])
            self.tail, grown = self.tail + take, grown + take
            data, at = data[take:], at + take
            self.next = at
        return grown


def read_copy(path: Path) -> str:
    """A copy read back as one text: its start, a line for what was not kept, its end."""
    data = _read(path)
    end = len(data)
    for part in (_with(path, PREV), _with(path, TAIL)):
        segment = _read(part)
        match = OFFSET.match(segment)
        if not segment:
            continue
        body = segment[match.end() :] if match else segment
        start = int(match.group(1)) if match else end
        if start > end:
            data += b"\n[... %d bytes of the original not kept ...]\n" % (start - end)
        data += body
        end = start + len(body)
    return data.decode(errors="replace")


def original_end(path: Path) -> int:
    """Bytes of the original that a copy has taken in so far (where the next append starts)."""
    tail = _with(path, TAIL)
    try:
        with open(tail, "rb") as fh:
            match = OFFSET.match(fh.readline())
            if match:
                return int(match.group(1)) + os.fstat(fh.fileno()).st_size - match.end()
    except FileNotFoundError:
        pass
    return _size(path)


def read_from(path: Path, pos: int) -> tuple[bytes, int]:
    """What a copy holds of its original from byte `pos` on (a line for bytes not kept), and the
    original's offset after it: how `raystack logs -f` follows a capped log."""
    out = bytearray()
    size = _size(path)
    if pos < size:
        with open(path, "rb") as fh:
            fh.seek(pos)
            chunk = fh.read(size - pos)
        out += chunk
        pos += len(chunk)
    for part in (_with(path, PREV), _with(path, TAIL)):
        try:
            fh = open(part, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            continue
        with fh:
            header = fh.readline()
            match = OFFSET.match(header)
            if not match:
                continue
            start, body = int(match.group(1)), os.fstat(fh.fileno()).st_size - len(header)
            if start + body <= pos:
                continue
            if pos < start:
                out += b"\n[... %d bytes of the original not kept ...]\n" % (start - pos)
                pos = start
            fh.seek(len(header) + pos - start)
            chunk = fh.read(start + body - pos)
        out += chunk
        pos += len(chunk)
    return bytes(out), pos


def newest_part(path: Path) -> Path:
    """The part of a copy that holds its original's end (the main file until a tail exists)."""
    tail = _with(path, TAIL)
    return tail if tail.exists() else path


def log_end(path: os.PathLike[str] | str, size: int = 8192) -> str:
    """The last `size` bytes of a log, from the part that holds its end ("" where unreadable)."""
    try:
        with open(newest_part(Path(path)), "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def last_line(path: os.PathLike[str] | str, limit: int = 400) -> str:
    """The last non-empty line of a log (read from its end: logs can be large), without colour
    codes; lines Ray relays from the actors (`(Worker pid=42) ...`, printed late) come second,
    Ray's own preamble never ("" for a job that printed nothing)."""
    text = ANSI.sub("", log_end(path))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not PREAMBLE.search(ln)]
    own = [ln for ln in lines if not RELAYED.match(ln)]
    return (own or lines or [""])[-1][:limit]


def copy_parts(folder: Path) -> list[Path]:
    """Every file of the copies in a folder (for size accounting)."""
    return [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]


def _with(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


# ---------------------------------------------------------------------------- where copies are
def host_folder(cluster: str, host: str, allocation: str | None) -> Path | None:
    """The copies of node `host` in `allocation`: logs/ray/<host>/ while it is the latest one
    there, logs/ray/<host>/<allocation>/ once a later allocation used the host."""
    top = paths.cluster(cluster).ray_host_logs(host)
    if allocation is None or _text(top / ALLOCATION) == allocation:
        return top
    older = top / allocation
    return older if older.is_dir() else None


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def request_sync(cluster: str) -> float:
    """Ask every node program for a copy pass now; the time asked (compare with `synced`)."""
    path = paths.cluster(cluster).ray_logs / REQUEST
    asked = time.time()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, f"{asked:.3f}\n")
    return asked


def synced(folder: Path) -> float:
    """When the node program copying into `folder` last finished a pass (0: never)."""
    try:
        return float(_text(folder / SYNCED) or 0)
    except ValueError:
        return 0.0


def wait_synced(
    cluster: str, allocation: str, since: float, timeout: float, clock: Clock = REAL
) -> list[str]:
    """Wait until every node copying for `allocation` finished a pass after `since` (at most
    `timeout` s: a dead node never answers); the hosts that did not."""
    root = paths.cluster(cluster).ray_logs
    hosts = [p for p in root.iterdir() if p.is_dir() and _text(p / ALLOCATION) == allocation]

    def late() -> list[str]:
        return [p.name for p in hosts if synced(p) < since]

    def none_late() -> list[str] | None:
        return None if late() else []

    found = at_most(none_late, 0.2, clock, timeout)
    return late() if found is None else found  # (after the timeout: who is late)


# ---------------------------------------------------------------------------- a job's workers
