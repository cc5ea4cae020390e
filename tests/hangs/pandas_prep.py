"""healthy: a numpy/pandas preprocessing loop over chunks of a table (no counter: the chunk is an
object; its stack goes through pandas' functions)."""

import time

import numpy as np
import pandas as pd
from _corpus import done, started


def prepare(end: float) -> list[pd.DataFrame]:
    rng = np.random.default_rng(0)
    out = []
    while time.time() < end:
        for chunk in np.array_split(rng.standard_normal((20000, 4)), 10):
            frame = pd.DataFrame(chunk, columns=list("abcd"))
            frame["key"] = (frame["a"] * 10).round() % 7
            out.append(frame.groupby("key").agg({"b": "mean", "c": "std"}))
        out = out[-10:]
    return out


if __name__ == "__main__":
    prepare(started())
    done()
