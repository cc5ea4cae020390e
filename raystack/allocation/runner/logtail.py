"""A running job's log streamed into the cluster folder, appending only new bytes, capped.

One thread per attempt follows Ray's log stream (`JobSubmissionClient.tail_job_logs`, a
websocket) and appends what arrives, so a multi-GB GRPO log costs the runner O(new bytes) and
flat memory. Ray replays the stream from the start: after a runner restart the bytes already
taken in are skipped. The copy is capped (profile `job_log_cap`, default 1 GB per attempt) the
way Ray's own logs are (store/raylogs.CappedCopy): its start, then the two newest segments of
its end (<id>.log, <id>.log.tail.1, <id>.log.tail). If streaming fails, the rest of the log is
fetched once when the attempt ends, never more than FETCH_LIMIT bytes into memory. Last, what
Ray's API gave less of is taken from Ray's own file of the driver's output on this node (the
runner runs where the drivers run: the head): Ray's log API fails on output that is not UTF-8
(its stream then ends quietly, its fetch answers 500), and that output must not be lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from raystack.errors import RayApiError
from raystack.store import node_entries, raylogs, workerlogs
from raystack.store.ledger import JobRecord
from raystack.store.raylogs import CappedCopy, original_end
from raystack.waiting import Repeats

log = logging.getLogger("raystack.runner")
JOIN_TIMEOUT = 10.0  # seconds to wait for the stream's last lines once the job has ended
# Ray closes a finished job's log stream only seconds after the end (its tail polls once a
# second, then relays through the dashboard): below this size one fetch of the whole log is
# quicker, and the next job of the queue need not wait for the stream.
FETCH_WHOLE_BELOW = 8 << 20
FETCH_LIMIT = 64 << 20  # the most one fetch of a whole log may pull into the runner's memory
JOB_LOG_CAP = int(os.environ.get("RAYSTACK_JOB_LOG_CAP") or 1 << 30)
NO_CAP = 1 << 62
SYNC_WAIT = 10.0  # seconds a finished job waits for every node's copy of Ray's logs
LOCAL_PART = 8 << 20  # bytes read at a time from Ray's own file of a driver's output
# (a full filesystem fails the gathering on every runner pass until the job's end is recorded)
GATHERING = Repeats(time.monotonic, log, "gathering worker logs")


class LogTail:
    """Streams submission `sid`'s log into `path` (appending, capped) on a daemon thread."""

    def __init__(
        self,
        api: Any,
        sid: str,
        path: Path,
        start: bool = True,
        cap: int = JOB_LOG_CAP,
        local: Path | None = None,
    ):
        self.api, self.sid, self.path = api, sid, path
        self.local = local  # Ray's own file of the driver's output, where this runs (the head)
        self.failed: str | None = None
        self.closed = False
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.copy = CappedCopy(path, cap)
        self.at = original_end(path)  # bytes of Ray's log taken in (a restarted runner's too)
        self.thread = threading.Thread(target=self._run, name=f"log-{sid}", daemon=True)
        if start:
            self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self._stream())
        except Exception as exc:  # any failure falls back to one fetch at the end
            self.failed = f"{type(exc).__name__}: {exc}"

    async def _stream(self) -> None:
        seen = 0  # bytes of the replayed stream received
        async for chunk in self.api.jobs.tail_job_logs(self.sid):
            data = chunk.encode(errors="replace")
            with self.lock:
                if self.closed:
                    return
                new = data[max(0, self.at - seen) :] if seen + len(data) > self.at else b""
                seen += len(data)
                if new:
                    self._append(new)

    def _append(self, data: bytes) -> None:
        self.copy.append(data, self.at, NO_CAP)
        self.at += len(data)

    def complete(self) -> None:
        """Called once the attempt has ended: the copy then holds its whole log (capped)."""
        if self.thread.is_alive() and self.at < FETCH_WHOLE_BELOW:
            with self.lock:
                self.closed = True  # the stream writes nothing more; the fetch appends the rest
                if self._fetch_rest():  # (whole: the API read all of Ray's file, so it was UTF-8)
                    return
                self.closed = False  # no answer: the stream's own end, then
        if self.thread.is_alive():
            self.thread.join(JOIN_TIMEOUT)
        with self.lock:
            self.closed = True  # a stream still running writes nothing more
            if self.thread.is_alive() or self.failed or not self.thread.ident:
                if self.failed:
                    log.warning("log stream of %s failed (%s); fetching the rest", self.sid, self.failed)
                if not self._fetch_rest() and not self._take_local():
                    self._append(
                        b"\n[raystack: the rest of this log was not fetched (over %d MB, or the "
                        b"dashboard did not answer); Ray's own copy: logs/ray/<head>/job-driver-%s.log]\n"
                        % (FETCH_LIMIT >> 20, self.sid.encode())
                    )
                return
            self._take_local()

    def _take_local(self) -> bool:
        """Append what the copy lacks of Ray's own file of the driver's output (read in parts);
        False where there is no such file here. Its bytes are what the API sends, as long as
        they are UTF-8: where they are not, the API stopped there."""
        try:
            if self.local is None or not self.local.is_file():
                return False
            with open(self.local, "rb") as fh:
                fh.seek(self.at)
                while part := fh.read(LOCAL_PART):
                    self._append(part)
        except OSError as exc:
            log.warning("log of %s: Ray's file %s not read: %s", self.sid, self.local, exc)
            return False
        return True

    def _fetch_rest(self) -> bool:
        """Append what the copy lacks of the whole log (one bounded request); False if it failed
        or the log is over FETCH_LIMIT (then the stream, or Ray's own copy, has it)."""
        try:
            text = self.api.log_bounded(self.sid, FETCH_LIMIT)
            if text is None:
                return False
            data = text.encode(errors="replace")
            if len(data) > self.at:
                self._append(data[self.at :])
        except Exception:  # (any failure of Ray's client or the disk: the caller decides)
            return False
        return True


class Tails:
    """The queue runner's tails: one LogTail per running attempt, streaming its log into
    logs/jobs/<id>/ (and, on the head, reading Ray's own file of the driver's output)."""

    def __init__(self, api: Any, paths: Any, ends: Any, ray_logs: str | None):
        self.api, self.paths, self.ends, self.ray_logs = api, paths, ends, ray_logs
        self.running: dict[str, LogTail] = {}

    def driver_log(self, sid: str) -> Path | None:
        """Ray's own file of a driver's output on this node (the head: drivers run there)."""
        return Path(self.ray_logs) / f"job-driver-{sid}.log" if self.ray_logs else None

    def follow(self, record: JobRecord) -> None:
        """Stream the running attempt's log (once per attempt, as it is first seen running)."""
        n, sid = len(record.attempts), record.attempts[-1].id
        if sid not in self.running:
            self.ends.watch(record.id, sid)  # (its driver's exit wakes the runner)
            path = self.paths.job_log(record.id, n)
            self.running[sid] = LogTail(self.api, sid, path, local=self.driver_log(sid))

    def close(self, record: JobRecord, sid: str) -> None:
        """The attempt ended: its log is complete on disk (fetched whole if streaming failed)."""
        tail = self.running.pop(sid, None)
        if tail is None:  # ended before it was seen running: fetch its log whole
            path = self.paths.job_log(record.id, len(record.attempts))
            tail = LogTail(self.api, sid, path, start=False, local=self.driver_log(sid))
        tail.complete()


def gather(name: str, allocation: str, api: Any, record: JobRecord, events: bool = False) -> str | None:
    """An ended job's actors' worker logs into logs/jobs/<id>/ (after a copy pass of every node,
    asked for now), with the failures Ray recorded (`events`); the first error line."""
    found: list[dict[str, Any]] = []
    for attempt in record.attempts if events else []:
        if attempt.ray_job_id and attempt.allocation == allocation:
            try:
                found += api.job_errors(attempt.ray_job_id)
            except RayApiError as exc:
                log.warning("%s: Ray's record of its failures not read: %s", record.id, exc)
    hosts = {str(e.get("ip")): host for host, e in node_entries.read_node_entries(name).items()}
    try:
        asked = raylogs.request_sync(name)
        late = raylogs.wait_synced(name, allocation, asked, SYNC_WAIT)
        if late:
            log.warning("%s: no copy of Ray's logs from %s yet; gathering what is there", record.id, late)
        summary = workerlogs.summary(workerlogs.gather(name, record, found, hosts))
        GATHERING.over()
        return summary
    except OSError as exc:  # (the shared filesystem): the job's outcome is recorded anyway
        GATHERING.failed(f"{record.id}: {exc}")
        return None
