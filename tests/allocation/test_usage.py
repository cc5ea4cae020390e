"""The node programs' usage sampler, for real on this machine (psutil; nvidia-smi where found):
one JSON line per period with this machine's CPU, memory and the cores its children burn."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from raystack.allocation.node.usage import UsageSampler, gpu_usage
from raystack.store import cluster as clusters
from raystack.store.usage import read_samples
from raystack.waiting import FakeClock

from ..conftest import wait_until


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    return tmp_path


def test_a_sample_counts_the_cores_a_child_burns(home: Path) -> None:
    clock = FakeClock()
    sampler = UsageSampler("c", "42", "node1", every=0.5, clock=clock)
    burn = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        child = psutil.Process(burn.pid)
        wait_until(lambda: child.cpu_times().user > 0.05, 30, "the child to start burning")
        sampler.ours()  # the child is now known: its next reading counts from here
        t0, cpu0 = time.monotonic(), sum(child.cpu_times()[:2])
        wait_until(lambda: sum(child.cpu_times()[:2]) - cpu0 >= 1.0, 60, "a second of the child's CPU")
        sampler()
        # what the child really got (on a loaded 2-core machine less than one core)
        got = (sum(child.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        clock.advance(0.6)
        sampler()  # a second line once the period has passed
        sampler()  # and not a third one within it
    finally:
        burn.kill()
        burn.wait()
    lines = (home / "rs" / "clusters" / "c" / "usage" / "42-node1.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["ours"] > 0.05 and abs(first["ours"] - got) < 0.1, (first, got)  # the sampler saw it
    assert 0 <= first["cpu"] <= 100 and 0 < first["mem"] < first["mem_total"]
    # a CPU machine reports no GPU; one with nvidia-smi one row per GPU
    assert len(first["gpus"]) == (len(gpu_usage(None)) if shutil.which("nvidia-smi") else 0)
    samples = read_samples(home / "rs" / "clusters" / "c" / "usage" / "42-node1.jsonl")
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples) and len(samples) == 2
