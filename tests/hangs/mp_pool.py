"""healthy: a multiprocessing pool at work: the parent sleeps in `pool.map`, its workers compute."""

import multiprocessing as mp
import time

from _corpus import done, started


def work(seed: int) -> float:
    total, x = 0.0, seed
    for _ in range(2_000_000):
        x = (x * 1103515245 + 12345) % 2**31
        total += x / 2**31
    return total


if __name__ == "__main__":
    end = started()
    with mp.get_context("spawn").Pool(2) as pool:
        while time.time() < end:
            pool.map(work, range(4))
    done()
