"""A running job's log streamed into the cluster folder, appending only new bytes.

One thread per attempt follows Ray's log stream (`JobSubmissionClient.tail_job_logs`, a
websocket) and appends what arrives, so a multi-GB GRPO log costs the runner O(new bytes) and
flat memory. Ray replays the stream from the start: after a runner restart the bytes already
on disk are skipped. If streaming fails, the whole log is fetched once when the attempt ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("raystack.runner")
JOIN_TIMEOUT = 10.0  # seconds to wait for the stream's last lines once the job has ended
# Ray closes a finished job's log stream only seconds after the end (its tail polls once a
# second, then relays through the dashboard): below this size one fetch of the whole log is
# quicker, and the next job of the queue need not wait for the stream.
FETCH_WHOLE_BELOW = 8 << 20


class LogTail:
    """Streams submission `sid`'s log into `path` (appending) on a daemon thread."""

    def __init__(self, api: Any, sid: str, path: Path, start: bool = True):
        self.api, self.sid, self.path = api, sid, path
        self.failed: str | None = None
        self.closed = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"log-{sid}", daemon=True)
        if start:
            self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self._stream())
        except Exception as exc:  # any failure falls back to one full fetch at the end
            self.failed = f"{type(exc).__name__}: {exc}"

    async def _stream(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        skip = self.path.stat().st_size if self.path.exists() else 0
        with open(self.path, "ab") as out:
            async for chunk in self.api.jobs.tail_job_logs(self.sid):
                data = chunk.encode(errors="replace")
                if skip:
                    cut = min(skip, len(data))
                    data, skip = data[cut:], skip - cut
                with self.lock:
                    if self.closed:
                        return
                    if data:
                        out.write(data)
                        out.flush()

    def complete(self) -> None:
        """Called once the attempt has ended: the file then holds its whole log."""
        size = self.path.stat().st_size if self.path.exists() else 0
        if self.thread.is_alive() and size < FETCH_WHOLE_BELOW:
            with self.lock:
                self.closed = True  # the stream writes nothing more; the fetch appends the rest
                if self._fetch_rest():
                    return
                self.closed = False  # no answer: the stream's own end, then
        if self.thread.is_alive():
            self.thread.join(JOIN_TIMEOUT)
        with self.lock:
            self.closed = True  # a stream still running writes nothing more
        if self.thread.is_alive() or self.failed or not self.thread.ident:
            if self.failed:
                log.warning("log stream of %s failed (%s); fetching it whole", self.sid, self.failed)
            self._fetch_rest()

    def _fetch_rest(self) -> bool:
        """Append what the file lacks of the whole log (one request); False if it failed."""
        try:
            data = self.api.logs(self.sid).encode(errors="replace")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            have = self.path.stat().st_size if self.path.exists() else 0
            if len(data) > have:
                with open(self.path, "ab") as out:
                    out.write(data[have:])
        except Exception:  # (any failure of Ray's client or the disk: the caller decides)
            return False
        return True
