"""Shell completion as bash asks for it (typer's protocol: COMP_WORDS, COMP_CWORD and
_RAYSTACK_COMPLETE=complete_bash): cluster names, job ids of the cluster on the line, profiles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raystack.store import cluster as clusters
from raystack.store import queue
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRequest

RAYSTACK = Path(sys.executable).with_name("raystack")


def complete(line: str, home: Path) -> list[str]:
    words = line.split()
    cword = len(words) if line.endswith(" ") else len(words) - 1
    env = {**os.environ, "RAYSTACK_HOME": str(home), "COMP_WORDS": line, "COMP_CWORD": str(cword)}
    env["_RAYSTACK_COMPLETE"] = "complete_bash"
    done = subprocess.run([str(RAYSTACK)], env=env, capture_output=True, text=True, timeout=60)
    return done.stdout.split()


@pytest.mark.skipif(not RAYSTACK.exists(), reason="the raystack command is not installed beside this Python")
def test_completion_offers_clusters_job_ids_and_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    for name in ("alpha", "beta"):
        clusters.create(name)
        clusters.write(ClusterRecord(name=name, state=ClusterState.READY))
    queue.enqueue(JobRequest(id="train-1234abcd", name="train", cluster="alpha", entrypoint="true"))
    queue.enqueue(JobRequest(id="eval-0000ffff", name="eval", cluster="beta", entrypoint="true"))
    assert complete("raystack down a", tmp_path) == ["alpha"]
    assert complete("raystack queue --cluster ", tmp_path) == ["alpha", "beta"]
    assert complete("raystack logs -c alpha ", tmp_path) == ["train-1234abcd"]
    assert complete("raystack cancel ev", tmp_path) == ["eval-0000ffff"]  # (no -c: every cluster's)
    assert set(complete("raystack up -P isa", tmp_path)) == {"isambard", "isambard-nccl"}
