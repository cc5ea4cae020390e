"""Benchmark: what copying a node's Ray logs costs (issue: Ray's logs outlive the allocation).

A Ray-shaped log folder of 400 files (Ray's own logs and 130 workers' .out/.err/core logs, 64 KB
each to start) is copied by one node's LogSync, pass after pass, while it grows as a busy GRPO
node's does: 60 workers append 8 KB each per pass, one chatty worker 10 MB per pass (100 MB over
the run). In the same run, the baseline a hand-written sync does (copy every file again each
pass, `cp -r`): time per pass and bytes written to the shared filesystem. Default caps (32 MB per
file, 512 MB per node).

    python bench/log_sync_cost.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import publish  # noqa: E402

from raystack.allocation.node.logsync import LogSync  # noqa: E402
from raystack.store import cluster as clusters  # noqa: E402
from raystack.store import paths, raylogs  # noqa: E402

PASSES, WORKERS, BUSY, STEP, CHATTY = 10, 130, 60, 8 << 10, 10 << 20
LINE = b"2026-11-22 12:00:00,000 INFO step 123 loss 0.4321 reward 0.75 tokens 4096 " + b"." * 40 + b"\n"


def fill(path: Path, size: int) -> None:
    with open(path, "ab") as fh:
        fh.write(LINE * (size // len(LINE)))


def wchar() -> int:
    """Bytes this process has passed to write() so far (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="logsync-"))
    os.environ["RAYSTACK_HOME"] = str(tmp / "home")
    clusters.create("b")
    logs = tmp / "ray" / "session_latest" / "logs"
    (logs / "old").mkdir(parents=True)
    names = [
        f"{n}.{k}"
        for n in ("raylet", "gcs_server", "dashboard", "dashboard_agent", "log_monitor")
        for k in ("out", "err")
    ]
    for w in range(WORKERS):
        wid = f"{w:056x}"
        names += [f"worker-{wid}-ffffffff-{1000 + w}.out", f"worker-{wid}-ffffffff-{1000 + w}.err"]
        names.append(f"python-core-worker-{wid}_{1000 + w}.log")
    for name in names:
        (logs / name).write_bytes(b":job_id:02000000\n:actor_name:Learner\n")
        fill(logs / name, 64 << 10)
    sync = LogSync("b", "node1", "1", tmp / "ray", raylogs.Caps(every=0))
    sync.prepare()
    baseline = tmp / "recopy"
    rows: dict[str, list[float]] = {"raystack_s": [], "recopy_s": [], "idle_s": []}
    written = {"raystack": 0, "recopy": 0}
    appended = 0
    dest = paths.cluster("b").ray_host_logs("node1")
    for n in range(PASSES + 1):
        if n:  # the folder grows between passes
            for w in range(BUSY):
                fill(logs / names[10 + 3 * w], STEP)
            fill(logs / names[10], CHATTY)
            appended += BUSY * STEP + CHATTY
        before = wchar()
        t = time.perf_counter()
        sync.sync()
        rows["raystack_s"].append(time.perf_counter() - t)
        written["raystack"] += wchar() - before
        t = time.perf_counter()
        shutil.rmtree(baseline, ignore_errors=True)
        shutil.copytree(logs, baseline)
        rows["recopy_s"].append(time.perf_counter() - t)
        written["recopy"] += folder_bytes(baseline)
        t = time.perf_counter()
        sync.sync()  # nothing new: a pass's floor (listing and stat)
        rows["idle_s"].append(time.perf_counter() - t)
    copy_total = folder_bytes(dest)
    biggest = max(
        sum(p.stat().st_size for p in dest.glob(f"{names[10]}*")),
        max(p.stat().st_size for p in dest.iterdir() if p.is_file()),
    )
    med = {k: statistics.median(v[1:]) for k, v in rows.items()}
    ratio = med["raystack_s"] / med["recopy_s"]
    table = "\n".join(
        [
            f"{len(names)} files, {PASSES} passes, {appended / 2**20:.0f} MB appended "
            f"({CHATTY >> 20} MB/pass by one worker, {BUSY} x {STEP >> 10} KB)",
            f"  {'':24}{'raystack':>12}{'recopy':>12}",
            f"  {'pass, median s':24}{med['raystack_s']:>12.3f}{med['recopy_s']:>12.3f}",
            f"  {'pass, nothing new s':24}{med['idle_s']:>12.4f}{'-':>12}",
            f"  {'bytes written, MB':24}{written['raystack'] / 2**20:>12.1f}{written['recopy'] / 2**20:>12.1f}",
            f"  raystack / recopy time per pass: {ratio:.2f}; copy of the chatty file {biggest / 2**20:.1f} MB "
            f"(cap 32 MB); the node's copies {copy_total / 2**20:.1f} MB",
        ]
    )
    publish(
        "log_sync_cost",
        table,
        {
            "files": len(names),
            "passes": PASSES,
            "appended_mb": round(appended / 2**20, 1),
            "pass_s": {k: round(v, 4) for k, v in med.items()},
            "written_mb": {k: round(v / 2**20, 1) for k, v in written.items()},
            "time_ratio": round(ratio, 3),
            "chatty_copy_mb": round(biggest / 2**20, 2),
            "node_copy_mb": round(copy_total / 2**20, 1),
        },
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
