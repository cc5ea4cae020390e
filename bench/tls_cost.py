"""Benchmark: what mutual TLS (`tls: true`) costs, against the same cluster without it.

On the testbed, in the same run, --rounds rounds of a plain and a TLS cluster of 2 nodes, both up
at once (the one started first alternates):
  start     `up` -> READY (the CA, a certificate per node, Ray with TLS, the HTTPS front)
  queue     --jobs trivial jobs (`python -c pass`) submitted at once: per-job total time
  transfer  1 GiB moved between the two nodes' object stores (jobs/debug/transfer.py: 4 objects
            of 256 MiB made on node A and read by a task on node B, minus the same reads on A),
            --transfers times on each cluster, the two taking turns: this machine's speed drifts
            by a third within minutes, as much as TLS costs, so the arms are compared seconds
            apart rather than a cluster's lifetime apart
Reported: medians and TLS / plain ratios (issue 43's target: transfer >= 0.8x), and beside
them what TLS adds per GiB moved against what this machine's cores take to encrypt and decrypt a
GiB with AES-128-GCM (TLS 1.3's cipher here; one core, best of 3, before any cluster starts). On
the testbed both "nodes" of a transfer share the machine's 2 cores, so the sender's encryption and
the receiver's decryption cannot run beside the copy; on real nodes each side has its own.

    python bench/tls_cost.py [--rounds 2] [--jobs 6] [--transfers 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import on_testbed, publish  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.spec.profile import load_profile  # noqa: E402
from raystack.store.ledger import JobState  # noqa: E402

NODES = 2
TRANSFER = ["python", "transfer.py", "--mib", "1024", "--chunk-mib", "256", "--repeats", "3"]


def up(tls: bool, i: int) -> tuple[Cluster, float]:
    # 4 objects of 256 MiB in flight at most: an object store of 768 MB on each node.
    profile = load_profile("testbed").model_copy(update={"tls": tls, "object_store_memory": "768MB"})
    t0 = time.time()
    cluster = Cluster.up(NODES, profile=profile, name=f"tls{int(tls)}-{i}", timeout=300)
    assert cluster.record().tls is tls
    return cluster, time.time() - t0


def queue_per_job(cluster: Cluster, jobs: int) -> float:
    t0 = time.time()
    submitted = [cluster.submit(["python", "-c", "pass"], sets=[f"name=q{k}"]) for k in range(jobs)]
    records = [job.wait(timeout=600) for job in submitted]
    assert all(r.state is JobState.SUCCEEDED for r in records), [r.message for r in records]
    return (max(r.ended or 0 for r in records) - t0) / jobs


def transfer(cluster: Cluster, k: int) -> dict:
    job = cluster.submit(TRANSFER, sets=[f"working_dir={REPO / 'jobs' / 'debug'}", f"name=transfer{k}"])
    record = job.wait(timeout=900)
    assert record.state is JobState.SUCCEEDED, record.message
    line = next(ln for ln in job.logs().splitlines() if ln.startswith("TRANSFER "))
    return json.loads(line.removeprefix("TRANSFER "))


def one_round(i: int, jobs: int, transfers: int) -> dict[bool, dict]:
    """A plain and a TLS cluster, both up (the testbed's 4 nodes hold two of 2): each one's start
    and queue, then `transfers` transfers on each, taking turns, so that the two arms' transfers
    are seconds apart rather than a cluster's lifetime."""
    first, second = order(i)
    clusters: dict[bool, Cluster] = {}
    out: dict[bool, dict] = {}
    try:
        for tls in (first, second):
            clusters[tls], start = up(tls, i)
            out[tls] = {"start_s": start, "transfers": []}
        for tls in (first, second):
            out[tls]["queue_per_job_s"] = queue_per_job(clusters[tls], jobs)
        for k in range(transfers):
            for tls in (first, second) if k % 2 == 0 else (second, first):
                out[tls]["transfers"].append(transfer(clusters[tls], k))
    finally:
        for cluster in clusters.values():
            cluster.down()
    return out


def order(i: int) -> tuple[bool, bool]:
    """Round i's arms, plain first in even rounds and TLS first in odd ones: this machine's speed
    drifts by a third within minutes, so neither arm is always the one that runs later."""
    return (False, True) if i % 2 == 0 else (True, False)


def pairs(plain: list[float], tls: list[float]) -> list[float]:
    """TLS / plain, turn by turn."""
    return [round(t / p, 2) for p, t in zip(plain, tls, strict=True)]


def crypto_seconds(gib: float = 0.25) -> float:
    """Seconds one core takes to encrypt and decrypt 1 GiB with AES-128-GCM in 16 KiB records (TLS's
    largest), through OpenSSL as Python's cryptography binds it (the best of 3, measured before any
    cluster starts). What gRPC adds around the cipher (framing, copies) is not in it."""
    import os

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    record = 16 << 10
    aead, nonce, data = AESGCM(AESGCM.generate_key(128)), os.urandom(12), os.urandom(record)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(int(gib * (1 << 30) / record)):
            aead.decrypt(nonce, aead.encrypt(nonce, data, None), None)
        best = min(best, (time.perf_counter() - t0) / gib)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--transfers", type=int, default=2, help="transfers on each cluster of a round")
    args = parser.parse_args()
    on_testbed("bench-tls-")
    crypto = crypto_seconds()
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for i in range(args.rounds):
        for tls, run in one_round(i, args.jobs, args.transfers).items():
            runs[tls].append(run)

    def med(tls: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs[tls])

    def rates(tls: bool) -> list[float]:  # (each transfer's rate as transfer.py computed it)
        return [t["gib_per_s"] for r in runs[tls] for t in r["transfers"]]

    def rate(tls: bool) -> float:
        return statistics.median(rates(tls))

    extra = 1 / rate(True) - 1 / rate(False)  # seconds TLS adds per GiB moved
    needed = 1 / (0.8 * rate(False)) - 1 / rate(False)  # what 0.8x would allow
    rows = [
        ("start (up -> READY), s", med(False, "start_s"), med(True, "start_s")),
        ("queue, s per trivial job", med(False, "queue_per_job_s"), med(True, "queue_per_job_s")),
        ("1 GiB node -> node, GiB/s", rate(False), rate(True)),
    ]
    lines = [f"{'':>28} {'plain':>8} {'tls':>8} {'tls/plain':>10}"]
    lines += [f"{name:>28} {p:>8.3f} {t:>8.3f} {t / p:>10.2f}" for name, p, t in rows]
    paired = pairs(rates(False), rates(True))
    lines.append(
        f"{args.rounds} rounds of a plain and a TLS {NODES}-node testbed cluster up together (plain started "
        f"first in the even rounds, TLS in the odd), {args.transfers} transfers on each taking turns; "
        f"medians; the transfer's TLS / plain turn by turn {paired}"
    )
    lines.append(
        f"TLS adds {extra:.2f} s per GiB moved; one core here encrypts and decrypts 1 GiB (AES-128-GCM) "
        f"in {crypto:.2f} s; 0.8x allows {needed:.2f} s"
    )
    publish(
        "tls_cost",
        "\n".join(lines),
        {
            "nodes": NODES,
            "rounds": args.rounds,
            "jobs": args.jobs,
            "transfers": args.transfers,
            "plain": runs[False],
            "tls": runs[True],
            "ratios": {name: round(t / p, 3) for name, p, t in rows},
            "transfer_pairs": paired,
            "crypto_s_per_gib": round(crypto, 3),
            "tls_extra_s_per_gib": round(extra, 3),
        },
    )


if __name__ == "__main__":
    main()
