"""The usage samples in the cluster folder (usage/<alloc_id>-<host>.jsonl, appended by each node
program's sampler: allocation/node/usage.py), read back by `raystack report` and `top`."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any


def read_samples(path: os.PathLike[str] | str) -> list[dict[str, Any]]:
    """The samples of one file, oldest first; a torn last line (node killed mid-write) skipped."""
    samples = []
    try:
        with open(path) as fh:
            for line in fh:
                with contextlib.suppress(ValueError):
                    sample = json.loads(line)
                    if isinstance(sample, dict) and isinstance(sample.get("t"), int | float):
                        samples.append(sample)
    except FileNotFoundError:
        return []
    return samples
