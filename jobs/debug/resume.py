"""resume: a counter that checkpoints every step to an absolute shared path and resumes from it.

The test subject for checkpoint resume and walltime chaining: run it, stop it, run it again, and
the count continues where it stopped. The checkpoint folder is $RAYSTACK_OUTPUT_CHECKPOINTS
(the spec's `outputs.checkpoints`, made absolute on the shared filesystem by raystack) or --dir.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

stopping = False


def on_term(_signum: int, _frame: object) -> None:
    global stopping
    stopping = True


def save(folder: Path, state: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".state.")
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, folder / "state.json")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.5, help="simulated work per step")
    parser.add_argument("--dir", default=os.environ.get("RAYSTACK_OUTPUT_CHECKPOINTS", ""))
    args = parser.parse_args()
    if not args.dir or not os.path.isabs(args.dir):
        print("resume: need an absolute checkpoint folder (outputs.checkpoints or --dir)", file=sys.stderr)
        return 2
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, on_term)
    state = (
        json.loads((folder / "state.json").read_text()) if (folder / "state.json").exists() else {"step": 0}
    )
    runs = state.get("runs", 0) + 1
    print(f"resume: starting at step {state['step']} (run {runs}), checkpoints in {folder}", flush=True)
    while state["step"] < args.steps and not stopping:
        time.sleep(args.step_seconds)  # the "training" of one step
        state = {"step": state["step"] + 1, "runs": runs, "time": time.time()}
        save(folder, state)
        print(f"step {state['step']}", flush=True)
    if stopping:
        print(f"resume: stopped at step {state['step']}; checkpoint saved", flush=True)
        return 143
    print(f"RESUME done at step {state['step']} after {runs} run(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
