"""A Prometheus for the dashboard: with metrics on and a `prometheus` binary found (the profile's
`prometheus:`, else PATH), the head runs one on 127.0.0.1 scraping every node through Ray's own
service-discovery file, and Ray's dashboard is started with RAY_PROMETHEUS_HOST pointing at it.

It listens on the loopback only (Prometheus has no auth): the dashboard, on the same host,
queries it; people reach its figures through the dashboard and its tunnel. Its data lives in the
node's private temp folder and goes with the allocation.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from raystack.launch.process import die_with_parent

log = logging.getLogger("raystack.node")
SD_FILE = "prom_metrics_service_discovery.json"  # written by Ray's dashboard every 5 s
CONFIG = """\
# Written by raystack: scrape every Ray node listed in Ray's service-discovery file.
global:
  scrape_interval: {every}s
  evaluation_interval: {every}s
scrape_configs:
- job_name: ray
  file_sd_configs:
  - files: ['{sd_file}']
    refresh_interval: {every}s
"""


def binary() -> str | None:
    """The Prometheus to run: RAYSTACK_PROMETHEUS (the profile's `prometheus:`), else PATH."""
    configured = os.environ.get("RAYSTACK_PROMETHEUS")
    if configured:
        return shutil.which(configured) or (configured if os.access(configured, os.X_OK) else None)
    return shutil.which("prometheus")


class Prometheus:
    """One Prometheus process on the head, a child of the node program."""

    def __init__(self, exe: str, port: int, folder: Path, log_path: Path, every: int = 10):
        self.exe, self.port, self.folder, self.log_path, self.every = exe, port, folder, log_path, every
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, session_dir: Path) -> subprocess.Popen:
        """Start scraping the nodes listed in `session_dir`'s service-discovery file."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        config = self.folder / "prometheus.yml"
        config.write_text(CONFIG.format(every=self.every, sd_file=session_dir / SD_FILE))
        argv = [
            self.exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        log.info("starting Prometheus: %s", " ".join(argv))
        with open(self.log_path, "a") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.folder, preexec_fn=die_with_parent
            )
        return self.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
