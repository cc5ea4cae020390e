"""hung: two threads that take two locks in opposite orders (a deadlock); the main thread waits to
join them."""

import threading

from _corpus import started

first, second = threading.Lock(), threading.Lock()
both = threading.Barrier(2)


def one() -> None:
    with first:
        both.wait()
        with second:
            pass


def other() -> None:
    with second:
        both.wait()
        with first:
            pass


if __name__ == "__main__":
    started()
    threads = [threading.Thread(target=one), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
