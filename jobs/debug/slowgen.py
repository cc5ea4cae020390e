"""slowgen: a GRPO-shaped job whose learner waits, printing nothing, on a generator that is slow.

The driver asks a Learner actor for --rounds steps; each step the learner waits (ray.get, asleep)
on a Generator actor that computes for --seconds in a Python loop whose stack changes (a vLLM
engine generating looks the same from outside). Only the generator moves: the job is not hung.
It prints `SLOWGEN {...}` once at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import ray


@ray.remote(num_cpus=0)
class Generator:
    def generate(self, seconds: float) -> dict:
        tokens, end = 0, time.time() + seconds
        while time.time() < end:
            tokens = sample(tokens)
        return {"tokens": tokens, "host": socket.gethostname(), "pid": os.getpid()}


def sample(tokens: int) -> int:
    logits = [((tokens * 31 + i) % 97) / 97 for i in range(200)]
    best = max(range(len(logits)), key=logits.__getitem__)
    return tokens + 1 + best % 2


@ray.remote(num_cpus=0)
class Learner:
    def __init__(self, generator: object):
        self.generator = generator

    def step(self, seconds: float) -> int:
        rollout = ray.get(self.generator.generate.remote(seconds))  # (asleep meanwhile)
        return int(rollout["tokens"])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    ray.init()
    learner = Learner.remote(Generator.remote())
    t0, tokens = time.time(), []
    for _ in range(args.rounds):
        tokens.append(ray.get(learner.step.remote(args.seconds)))
    print(
        "SLOWGEN "
        + json.dumps({"rounds": args.rounds, "tokens": tokens, "seconds": round(time.time() - t0, 1)})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
