"""File operations per second that N node programs cost the shared filesystem (issue: the shared
filesystem at 256 nodes). Sites ban metadata storms: every operation on the cluster folder is a
round trip to the metadata server on Lustre or NFS.

The steady state of an allocation of N nodes (a job running, with a hang timeout) is simulated in
one process on a fake clock: every node's real loop duties (raystack's own classes: heartbeat,
GPU report, usage sample, stack-request poll, Ray-log copy poll and pass, the workers' watch of
the head, the head's node watch and idle check) and the queue runner's (journal read, watchdog),
with every file operation under RAYSTACK_HOME counted (open, stat, listing, rename, unlink, fsync,
link, write-in-place). The baseline is the cde9410 GPU report (every GPU node read every node's
entry and rewrote its own with fsync every second), run beside the rest in the same simulation.

    python bench/fs_ops.py [--nodes 1,4,16,64,256] [--seconds 120]
"""

from __future__ import annotations

import argparse
import builtins
import io
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, publish

from raystack.allocation.elastic.idle import IdleWatch
from raystack.allocation.head import program as head_mod
from raystack.allocation.node import duties as node_duties
from raystack.allocation.node import worker as worker_mod
from raystack.allocation.node.context import NodeContext
from raystack.allocation.node.duties import GpuReport, Heartbeat
from raystack.allocation.node.logsync import LogSync
from raystack.allocation.node.usage import UsageSampler
from raystack.allocation.watchdog.stacks import StackRequests
from raystack.allocation.watchdog.verdict import Watchdog
from raystack.spec.profile import Caps
from raystack.store import cluster as records
from raystack.store import node_entries
from raystack.store import queue as store
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.waiting import Every, FakeClock

COUNTED = (
    "open",
    "os.open",
    "stat",
    "scandir",
    "listdir",
    "replace",
    "rename",
    "unlink",
    "fsync",
    "link",
    "pwrite",
)


class Counting:
    """Counts file operations on paths under `root` while installed (fsync and pwrite: always)."""

    def __init__(self, root: str):
        self.root, self.ops = root, Counter()
        self.saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str, label: str, path_arg: bool = True) -> None:
        real = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            target = args[0] if args else kwargs.get("file") or kwargs.get("path")
            if not path_arg or (isinstance(target, str | os.PathLike) and str(target).startswith(self.root)):
                self.ops[label] += 1
            return real(*args, **kwargs)

        self.saved.append((owner, name, real))
        setattr(owner, name, counted)

    def __enter__(self) -> Counting:
        self._wrap(builtins, "open", "open")
        self._wrap(io, "open", "open")
        self._wrap(os, "open", "os.open")
        for name in ("stat", "lstat"):
            self._wrap(os, name, "stat")
        for name in ("scandir", "listdir", "replace", "rename", "unlink", "link"):
            self._wrap(os, name, name)
        self._wrap(os, "fsync", "fsync", path_arg=False)
        self._wrap(os, "pwrite", "pwrite", path_arg=False)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, real in reversed(self.saved):
            setattr(owner, name, real)


class LegacyGpuReport:
    """cde9410's GpuReport, as it was: every second, read every node's entry, rewrite its own."""

    def __init__(self, ctx: NodeContext, clock: FakeClock):
        self.ctx, self.gate = ctx, Every(1.0, clock)

    def __call__(self) -> None:
        if not self.gate():
            return
        entry = node_entries.read_node_entries(self.ctx.cluster).get(self.ctx.host, {})
        entry.update(gpu_procs=[], gpu_checked=0.0)
        node_entries.write_node_entry(self.ctx.cluster, self.ctx.host, entry)


def node(i: int, n: int, temp: Path) -> NodeContext:
    ctx = NodeContext(
        cluster="b",
        alloc_id="100",
        node_id=i,
        num_nodes=n,
        host=f"node{i + 1}",
        ip=f"10.1.{i // 250}.{i % 250 + 1}",
        gpus=4,
        cpus=64,
        temp_dir=temp / f"node{i + 1}",
        object_store_bytes=2**30,
        join_timeout=300,
        ray_logs=Caps.model_validate({"every": "30s"}),
    )
    ctx.entry = {"ip": ctx.ip, "node_id": i, "gpus": 4, "cpus": 64, "alloc_id": "100"}
    node_entries.write_node_entry("b", ctx.host, ctx.entry)
    return ctx


class Alive:
    """The head's dashboard as NodeWatch reads it: every node alive."""

    def __init__(self, ips: list[str]):
        self.ips = ips

    def alive_nodes(self) -> list[Any]:
        return [type("N", (), {"ip": ip, "resources": {}})() for ip in self.ips]

    def list_jobs(self) -> list[Any]:
        return []


def simulate(n: int, seconds: int, legacy: bool) -> dict[str, float]:
    """File operations per second, by kind and in all, of N nodes (and the runner) for `seconds`."""
    home = Path(tempfile.mkdtemp(prefix="fs-ops-"))
    os.environ["RAYSTACK_HOME"] = str(home)
    records.create("b")
    records.write(
        ClusterRecord(
            name="b",
            state=ClusterState.READY,
            allocation_id="100",
            nodes=[f"node{i + 1}" for i in range(n)],
            nodes_expected=n,
            gcs_address="10.1.0.1:6379",
            dashboard_url="http://10.1.0.1:8265",
        )
    )
    clock = FakeClock()
    ctxs = [node(i, n, home / "tmp") for i in range(n)]
    node_duties.has_nvidia_smi = lambda: True  # type: ignore[assignment]
    node_duties.gpu_processes = lambda: []  # type: ignore[assignment]
    duties: list[Callable[[], object]] = []
    for c in ctxs:
        sampler = UsageSampler("b", "100", c.host, clock=clock)
        sampler.sample = lambda: {"t": clock.now(), "jobs": {"j-1": [0.5, 0.5, 3]}}  # type: ignore[method-assign]
        sync = LogSync("b", c.host, "100", c.temp_dir, c.ray_logs)
        sync.prepare()
        sync_gate = Every(1.0, clock)  # its thread looks at the request file every second

        def logsync(sync: LogSync = sync, gate: Every = sync_gate) -> None:
            if gate() and (sync._asked() or clock.now() - sync.last >= sync.caps.every):
                sync.sync()
                sync.last = clock.now()

        sync.last = clock.now()
        duties += [
            LegacyGpuReport(c, clock) if legacy else GpuReport(c, clock=clock),
            sampler,
            StackRequests("b", c.host, clock=clock),
            logsync,
        ]
        if c.is_head:
            duties.append(Heartbeat(c, clock))
            watch = head_mod.NodeWatch(c, clock=clock)
            watch.dashboard = Alive([x.ip for x in ctxs])  # type: ignore[assignment]
            duties.append(watch)
            dashboard = watch.dashboard
            idle = IdleWatch("b", None, lambda d=dashboard: d, clock=clock.now)  # type: ignore[misc]
            duties.append(idle)
        else:
            duties.append(worker_mod.HeadWatch(c, "10.1.0.1:6379", clock, lambda h, p: True))
    journal = store.JournalReader("b")
    dog = Watchdog("b", None, "100", None, clock, hang=1800)
    dog_gate = Every(10.0, clock)
    with Counting(str(home)) as counter:
        t_end = clock.now() + seconds
        while clock.now() < t_end:
            for duty in duties:
                duty()
            for _ in range(10):  # the queue runner: ten passes a second
                journal.changes()
            if dog_gate():
                dog.samples_since(0)
            clock.advance(1.0)
    ops = {k: v / seconds for k, v in counter.ops.items()}
    ops["total"] = sum(counter.ops.values()) / seconds
    return ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,4,16,64,256")
    parser.add_argument("--seconds", type=int, default=120)
    args = parser.parse_args()
    sizes = [int(x) for x in args.nodes.split(",")]
    rows = []
    for n in sizes:
        now, before = simulate(n, args.seconds, legacy=False), simulate(n, args.seconds, legacy=True)
        rows.append(
            {
                "nodes": n,
                "ops_per_s": round(now["total"], 1),
                "cde9410_ops_per_s": round(before["total"], 1),
                "per_node": round(now["total"] / n, 2),
                "by_kind": {k: round(v, 2) for k, v in sorted(now.items()) if k != "total"},
            }
        )
        print(
            f"N={n}: {now['total']:.1f} ops/s now, {before['total']:.1f} with cde9410's GPU report",
            flush=True,
        )
    lines = [f"{'nodes':>6} {'ops/s now':>10} {'per node':>9} {'ops/s cde9410':>14} {'ratio':>7}"]
    for r in rows:
        ratio = r["cde9410_ops_per_s"] / r["ops_per_s"] if r["ops_per_s"] else 0
        lines.append(
            f"{r['nodes']:>6} {r['ops_per_s']:>10.1f} {r['per_node']:>9.2f} {r['cde9410_ops_per_s']:>14.1f} {ratio:>6.1f}x"
        )
    big = rows[-1]
    slope = (rows[-1]["ops_per_s"] - rows[0]["ops_per_s"]) / max(1, rows[-1]["nodes"] - rows[0]["nodes"])
    lines.append(f"ops/s grow by {slope:.2f} per node (linear: O(N)); largest N by kind: {big['by_kind']}")
    plot(rows)
    publish(
        "fs_ops",
        "\n".join(lines),
        {
            "seconds_simulated": args.seconds,
            "rows": rows,
            "ops_per_node_slope": round(slope, 3),
            "target": "O(N) file operations per second for the whole cluster",
        },
    )
    return 0


def plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ns = [r["nodes"] for r in rows]
    ax.plot(ns, [r["ops_per_s"] for r in rows], "o-", label="raystack now")
    ax.plot(ns, [r["cde9410_ops_per_s"] for r in rows], "s--", label="cde9410 (GPU report every second)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("file operations per second (cluster folder)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "fs_ops.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
