"""hung: a driver in `ray.get` on an actor whose method waits for something that never comes."""

import threading

import ray
from _corpus import started


@ray.remote(num_cpus=0)
class Waiter:
    def run(self) -> None:
        threading.Event().wait()


if __name__ == "__main__":
    started()
    ray.init()
    ray.get(Waiter.remote().run.remote())
