"""envcheck: which of the named environment variables this process sees, each as the sha256 of its
value (never the value): `ENV_SEEN {"rank": 0, "host": ..., "seen": {"HF_TOKEN": "3a7bd3e2"}}`.

    python envcheck.py HF_TOKEN WANDB_API_KEY            (a driver)
    kind: spmd, command: envcheck.py HF_TOKEN            (every rank)
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys


def main() -> int:
    seen = {
        name: hashlib.sha256(os.environ[name].encode()).hexdigest()[:16]
        for name in sys.argv[1:]
        if name in os.environ
    }
    rank = int(os.environ.get("RANK", "0"))
    print("ENV_SEEN " + json.dumps({"rank": rank, "host": socket.gethostname(), "seen": seen}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
