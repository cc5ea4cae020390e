"""Ray's own logs outlive the allocation (issue: Ray logs), on one 4-node testbed cluster (testbed
profile: a copy pass every 5 s, 4 MB per file, 48 MB per node):

1. A job whose actor on node3 raises: FAILED, and its ledger message (and `raystack queue`)
   names node3, the actor and the exception.
2. A job whose actor on node2 writes 100 MB: the copies of node2 stay within their caps and
   still end with the actor's last line.
3. A node SIGKILLed mid-job: its copy holds the ticks its actor printed up to one pass before.
4. After `down`: `raystack logs ID --all` shows the driver log, then node3's actor with its
   traceback; `--node` and `--actor` filter.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.spec.profile import load_profile
from raystack.store import cluster as clusters
from raystack.store import paths, raylogs
from raystack.store.ledger import JobState

from ..conftest import module_home, wait_until
from .test_chain import kill_node
from .test_cluster import raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]

NAME = "rl"
JOBS = Path(__file__).resolve().parents[2] / "jobs" / "debug"
CAPS = load_profile("testbed").ray_logs
TICK = re.compile(r"^tick (\d+) at", re.M)


@pytest.fixture(scope="module")
def rl(testbed: Path) -> Iterator[dict]:
    with module_home(testbed, NAME) as home:
        up = raystack("up", "--nodes", "4", "--profile", "testbed", "--name", NAME)
        assert up.returncode == 0, up.stderr + up.stdout
        yield {"home": home, "job": clusters.read(NAME).allocation_id}
        raystack("down", NAME)


def faults(mode: str, on: str, *extra: str) -> str:
    return f"entrypoint=python faults.py {mode} --on {on} {' '.join(extra)}".strip()


def copies(host: str) -> Path:
    return paths.cluster(NAME).ray_host_logs(host)


def worker_copy(host: str, needle: str) -> Path | None:
    """The copy (start part) of `host`'s worker log that holds `needle`."""
    for path in sorted(copies(host).glob("worker-*.out")):
        if needle in raylogs.read_copy(path):
            return path
    return None


def test_an_actor_that_raises_on_node3_is_named_in_the_ledger(rl: dict) -> None:
    job = Cluster(NAME).submit(str(JOBS / "faults.yaml"))
    record = job.wait(timeout=300)
    assert record.state is JobState.FAILED, record
    assert re.match(r"node3 Worker pid \d+: ValueError: boom on node3", record.message), record.message
    assert record.actor_error and record.actor_error in record.message
    rows = json.loads(raystack("queue", NAME, "--json").stdout)
    assert any(r["id"] == job.id and r["message"].startswith("node3 Worker pid") for r in rows), rows
    table = raystack("queue", NAME, env={"COLUMNS": "300"}).stdout
    assert "node3 Worker pid" in table and "ValueError: boom on node3" in table, table
    rl["raise"] = job.id


def test_a_job_logging_100_mb_keeps_the_copies_within_their_caps(rl: dict) -> None:
    job = Cluster(NAME).submit(str(JOBS / "faults.yaml"), sets=[faults("spam", "node2", "--mb", "100")])
    record = job.wait(timeout=600)
    assert record.state is JobState.SUCCEEDED, job.logs()[-2000:]
    folder = copies("node2")
    wait_until(lambda: worker_copy("node2", "spam done on node2"), 30, "the last line in node2's copy")
    by_name: dict[str, int] = {}
    for part in raylogs.copy_parts(folder):
        base = part.name.removesuffix(raylogs.PREV).removesuffix(raylogs.TAIL)
        by_name[base] = by_name.get(base, 0) + part.stat().st_size
    assert max(by_name.values()) <= CAPS.file_bytes, sorted(by_name.items(), key=lambda kv: -kv[1])[:3]
    assert sum(by_name.values()) <= CAPS.node_bytes
    spam = worker_copy("node2", "spam done on node2")
    assert spam is not None
    text = raylogs.read_copy(spam)
    assert "bytes of the original not kept" in text, text[:2000]
    assert text.rstrip().splitlines()[-1].startswith("spam done on node2"), text[-500:]


def test_output_that_is_not_utf8_is_in_the_jobs_log_whole(rl: dict) -> None:
    """Ray's log API fails on it (its stream ends quietly, its fetch answers 500): the runner
    takes the rest from Ray's own file of the driver's output on the head."""
    code = (
        "import sys; sys.stdout.buffer.write(b'bad \\xff\\xfe bytes\\n' + b'y' * 100000 + b'\\nthe end\\n')"
    )
    job = Cluster(NAME).submit(["python", "-c", code])
    assert job.wait(timeout=300).state is JobState.SUCCEEDED
    shown = raystack("logs", job.id)
    assert shown.returncode == 0 and "bad " in shown.stdout, shown
    assert "y" * 100000 + "\nthe end" in shown.stdout, shown.stdout[-500:]


def test_a_node_killed_mid_job_left_its_logs_up_to_the_last_pass(rl: dict) -> None:
    job = Cluster(NAME).submit(str(JOBS / "faults.yaml"), sets=[faults("tick", "node4", "--seconds", "300")])
    wait_until(lambda: worker_copy("node4", "tick 30 at"), 120, "node4's ticks in its copy")
    source = next(
        p
        for p in Path("/tmp").glob(f"rs-{rl['job']}-node4-*/r/session_latest/logs/worker-*.out")
        if "tick " in p.read_text(errors="replace")
    )
    time.sleep(3)
    assert kill_node(rl["job"], "node4") > 0
    printed = max(int(n) for n in TICK.findall(source.read_text(errors="replace")))
    copy = worker_copy("node4", "tick 30 at")
    assert copy is not None
    kept = max(int(n) for n in TICK.findall(raylogs.read_copy(copy)))
    # 10 ticks a second; a pass every CAPS.every s (plus a slow pass on 2 busy cores)
    assert printed - 10 * (CAPS.every + 5) <= kept <= printed, (kept, printed)
    job.stop()  # (or, where the runner saw its node die first, it was run again without node4: done)
    record = job.wait(timeout=180)
    assert record.state in (JobState.STOPPED, JobState.FAILED, JobState.SUCCEEDED), record


def test_after_down_logs_all_shows_the_traceback_with_node_and_actor(rl: dict) -> None:
    job_id = rl["raise"]
    down = raystack("down", NAME)
    assert down.returncode == 0, down.stderr
    out = raystack("logs", job_id, "--all")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    section = re.search(
        r"^==> node3 Worker pid \d+ \(attempt 1\): ValueError: boom on node3 <==$", text, re.M
    )
    assert section, text[-3000:]
    after = text[section.end() :]
    assert 'raise ValueError(f"boom on {socket.gethostname()}")' in after, after
    assert text.index("actors on") < section.start()  # the driver's log first
    assert "==> node3" not in raystack("logs", job_id, "--node", "node1").stdout
    only = raystack("logs", job_id, "--node", "node3", "--actor", "worker").stdout
    assert "==> node3 Worker pid" in only and "ValueError: boom on node3" in only
    # the copies of the node killed mid-job are still there, and every node's raylet log
    for host in ("node1", "node2", "node3", "node4"):
        assert (copies(host) / "raylet.out").stat().st_size > 0, host
