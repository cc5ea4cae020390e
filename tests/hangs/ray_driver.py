"""healthy: a Ray driver asleep in `ray.get` while its actors compute (the learner waiting for its
rollout workers)."""

import time

import ray
from _corpus import done, seconds, started


@ray.remote(num_cpus=0)
class Worker:
    def run(self, seconds: float) -> int:
        end, n = time.time() + seconds, 0
        while time.time() < end:
            n += sum(i * i for i in range(2000)) % 7
        return n


if __name__ == "__main__":
    started()
    ray.init()
    workers = [Worker.remote() for _ in range(2)]
    ray.get([w.run.remote(seconds()) for w in workers])
    done()
