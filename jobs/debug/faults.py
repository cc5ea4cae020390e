"""faults: what a failing multi-node job leaves in Ray's worker logs (for `raystack logs --all`).

One actor per alive node (pinned to it), then one of:
  raise --on node3           node3's actor raises ValueError in a method: the job fails
  spam --on node2 --mb 100   node2's actor writes that many MB to its stdout, then the job ends
  tick --on node4 --seconds 120   node4's actor prints "tick N" every 0.1 s for that long (run again
                             after node4 died under it, RAYSTACK_RESUME=1: done at once)
  kaputt --on node3          node3's actor writes `RuntimeError: KAPUTT-node3` to its stderr and
                             dies at once (os._exit(1)), without the driver seeing its output
  hang                       every actor and the driver wait forever, printing nothing and using
                             no CPU (what an NCCL hang looks like from outside)
  big --gpus 5               an actor asks for more GPUs than a node has (it can never start)
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
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
        if mode == "kaputt":
            os.write(2, f"RuntimeError: KAPUTT-{socket.gethostname()}\n".encode())
            os._exit(1)
        if mode == "hang":
            threading.Event().wait()
        if mode == "tick":
            for n in range(int(seconds * 10)):
                print(f"tick {n} at {time.time():.2f}", flush=True)
                time.sleep(0.1)
        return me


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["raise", "spam", "tick", "kaputt", "hang", "big"])
    parser.add_argument("--on", default="", help="the node (host name) whose actor does it")
    parser.add_argument("--gpus", type=float, default=5)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--seconds", type=float, default=120)
    args = parser.parse_args()
    ray.init(log_to_driver=args.mode not in ("spam", "kaputt"))  # (100 MB through the driver's log: no)
    if args.mode == "big":
        print(f"asking for an actor with {args.gpus:g} GPUs", flush=True)
        big = Worker.options(num_gpus=args.gpus).remote()
        return 0 if ray.get(big.host.remote()) else 1  # (never: it cannot be placed)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    workers = [
        Worker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in nodes
    ]
    hosts = ray.get([w.host.remote() for w in workers])
    if args.mode == "hang":
        args.on = hosts[0]
    if args.on not in hosts and os.environ.get("RAYSTACK_RESUME") == "1":
        print(f"resumed without node {args.on} (lost): nothing to do there", flush=True)
    elif args.on not in hosts:
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
