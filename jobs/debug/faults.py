"""faults: what a failing multi-node job leaves in Ray's worker logs (for `raystack logs --all`).

One actor per alive node (pinned to it), then one of:
  raise --on node3           node3's actor raises ValueError in a method: the job fails
  spam --on node2 --mb 100   node2's actor writes that many MB to its stdout, then the job ends
  tick --on node4 --seconds 120   node4's actor prints "tick N" every 0.1 s for that long
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0, max_restarts=0)
class Worker:
    def host(self) -> str:
        return socket.gethostname()

    def run(self, mode: str, target: bool, mb: float, seconds: float) -> str:
        me = f"{socket.gethostname()} pid {os.getpid()}"
        print(f"worker {me} starts {mode}", flush=True)
        if not target:
            return me
        if mode == "raise":
            raise ValueError(f"boom on {socket.gethostname()}")
        if mode == "spam":
            line = b"spam " + b"x" * 1018 + b"\n"  # 1 KiB
            for _ in range(int(mb * 1024)):
                sys.stdout.buffer.write(line)
            sys.stdout.write(f"spam done on {me}\n")
            sys.stdout.flush()
        if mode == "tick":
            for n in range(int(seconds * 10)):
                print(f"tick {n} at {time.time():.2f}", flush=True)
                time.sleep(0.1)
        return me


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["raise", "spam", "tick"])
    parser.add_argument("--on", required=True, help="the node (host name) whose actor does it")
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=120)
    args = parser.parse_args()
    ray.init(log_to_driver=args.mode != "spam")  # (100 MB through the driver's log too: no)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    workers = [
        Worker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in nodes
    ]
    hosts = ray.get([w.host.remote() for w in workers])
    if args.on not in hosts:
        print(f"no node {args.on} among {hosts}", file=sys.stderr)
        return 2
    print(f"actors on {sorted(hosts)}", flush=True)
    done = ray.get(
        [
            w.run.remote(args.mode, h == args.on, args.mb, args.seconds)
            for w, h in zip(workers, hosts, strict=True)
        ]
    )
    print(f"finished: {done}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
