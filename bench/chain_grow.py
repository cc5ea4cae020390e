"""Benchmark: a grown allocation across a chain's hand-over (issue 44: the chain carries them).

On the testbed: `up -N 1 --chain 2 --time 3`, `grow -N 1 --time 10`; when the first head's
allocation ends (its walltime), the grown node leaves the dead head's Ray, waits for the second
head and joins it. Reported: the second head READY -> the grown node alive in its Ray (the
hand-over's cost for grown nodes), and whether a job that needs both nodes then runs. Passes
when the grown node rejoins and the job SUCCEEDS.

    python bench/chain_grow.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import on_testbed, publish  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.store import cluster as records  # noqa: E402
from raystack.store.ledger import JobState  # noqa: E402


def raystack(*args: str, check: bool = True) -> str:
    done = subprocess.run([sys.executable, "-m", "raystack.cli", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"raystack {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def until(what: str, timeout: float, check: object) -> float:
    deadline = time.time() + timeout
    while not check():  # type: ignore[operator]
        if time.time() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)
    return time.time()


def main() -> None:
    on_testbed("bench-chaingrow-")
    up = ["up", "-N", "1", "--profile", "testbed", "--time", "3", "--signal-lead", "60s", "--chain", "2"]
    raystack(*up, "--name", "cg")
    raystack("grow", "cg", "-N", "1", "--profile", "testbed", "--time", "10")
    try:
        first = records.read("cg").allocation_id
        ready = until(
            "the second head",
            400,
            lambda: (r := records.read("cg")).allocation_id != first and r.state.value == "READY",
        )
        alive = until(
            "the grown node in the second head's Ray",
            300,
            lambda: json.loads(raystack("status", "cg", "--json", check=False))["nodes_alive"] == 2,
        )
        job = Cluster("cg").submit(["python", "-c", "print('two nodes')"], sets=["needs.nodes=2"])
        record = job.wait(timeout=300)
    finally:
        raystack("down", "cg", check=False)
    ok = record.state is JobState.SUCCEEDED
    table = "\n".join(
        [
            "up -N 1 --chain 2 --time 3; grow -N 1 --time 10; the first head's walltime ends it",
            f"second head READY -> grown node in its Ray: {alive - ready:.1f} s",
            f"a job that needs both nodes: {record.state.value}",
        ]
    )
    publish(
        "chain_grow", table, {"rejoin_s": round(alive - ready, 1), "job": record.state.value, "passed": ok}
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
