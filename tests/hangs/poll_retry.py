"""hung: a poll loop that sleeps and retries the same check (a file another job should write),
counting its tries: a variable that changes, in a thread that barely runs."""

import os
import time

from _corpus import started


def wait_for(path: str) -> int:
    tries = 0
    while not os.path.exists(path):
        tries += 1
        time.sleep(0.2)
    return tries


if __name__ == "__main__":
    started()
    wait_for("/nonexistent/corpus-ready")
