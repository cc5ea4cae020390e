"""The node programs' usage sampler, for real on this machine (psutil; nvidia-smi where found):
one JSON line per period with this machine's CPU, memory and the cores its children burn."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raystack.allocation.usage import UsageSampler, read_samples
from raystack.store import cluster as clusters


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    return tmp_path


def test_a_sample_counts_the_cores_a_child_burns(home: Path) -> None:
    sampler = UsageSampler("c", "42", "node1", every=0.5)
    burn = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"]
    )
    try:
        time.sleep(0.2)
        sampler.ours()  # the child is now known: its next reading counts from here
        time.sleep(1.5)
        sampler()
        time.sleep(0.6)
        sampler()  # a second line once the period has passed
        sampler()  # and not a third one within it
    finally:
        burn.wait()
    lines = (home / "rs" / "clusters" / "c" / "usage" / "42-node1.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["ours"] >= 0.5, first  # one core busy (2 cores on CI: some slack)
    assert 0 <= first["cpu"] <= 100 and 0 < first["mem"] < first["mem_total"]
    assert isinstance(first["gpus"], list)
    samples = read_samples(home / "rs" / "clusters" / "c" / "usage" / "42-node1.jsonl")
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples) and len(samples) == 2
