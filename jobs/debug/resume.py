"""resume: a counter that checkpoints to an absolute shared path and resumes from it.

The test subject for checkpoint resume and walltime chaining: run it, stop it, run it again, and
the count continues from its last checkpoint. The checkpoint folder is
$RAYSTACK_OUTPUT_CHECKPOINTS (the spec's `outputs.checkpoints`, made absolute on the shared
filesystem by raystack) or --dir. Every step it does is appended to <dir>/steps.log (run, step,
time, allocation), so a test can check that across interruptions every step was done, and what
was redone since the last checkpoint. SIGTERM (raystack stop, the walltime warning) makes it
save and stop after the current step.
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


def done(state: dict, args: argparse.Namespace) -> bool:
    """Finished: --steps reached, or (--until-chain) --extra-steps done in that allocation."""
    if args.until_chain:
        here = int(os.environ.get("RAYSTACK_CHAIN_INDEX", "1"))
        return here >= args.until_chain and state.get("in_last", 0) >= args.extra_steps
    return state["step"] >= args.steps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.5, help="simulated work per step")
    parser.add_argument("--checkpoint-every", type=int, default=1, help="steps between checkpoints")
    parser.add_argument("--until-chain", type=int, default=0, help="run until this allocation of a chain")
    parser.add_argument("--extra-steps", type=int, default=10, help="steps to do there, then finish")
    parser.add_argument("--dir", default=os.environ.get("RAYSTACK_OUTPUT_CHECKPOINTS", ""))
    args = parser.parse_args()
    if not args.dir or not os.path.isabs(args.dir):
        print("resume: need an absolute checkpoint folder (outputs.checkpoints or --dir)", file=sys.stderr)
        return 2
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, on_term)
    saved = (
        json.loads((folder / "state.json").read_text()) if (folder / "state.json").exists() else {"step": 0}
    )
    runs = saved.get("runs", 0) + 1
    state = {"step": saved["step"], "runs": runs, "in_last": 0}
    allocation = os.environ.get("SLURM_JOB_ID", "?")
    resumes = os.environ.get("RAYSTACK_RESUME_COUNT", "0")
    note = os.environ.get("RESUME_NOTE", "")
    print(
        f"resume: starting at step {state['step']} (run {runs}, resume {resumes}, allocation {allocation})"
        f"{' ' + note if note else ''}, checkpoints in {folder}",
        flush=True,
    )
    with open(folder / "steps.log", "a") as trace:
        while not done(state, args) and not stopping:
            time.sleep(args.step_seconds)  # the "training" of one step
            state["step"] += 1
            state["in_last"] += 1
            trace.write(f"{runs} {state['step']} {time.time():.3f} {allocation}\n")
            trace.flush()
            if state["step"] % args.checkpoint_every == 0:
                save(folder, {"step": state["step"], "runs": runs, "time": time.time()})
            print(f"step {state['step']}", flush=True)
    if stopping:
        save(folder, {"step": state["step"], "runs": runs, "time": time.time()})
        print(f"resume: stopped at step {state['step']}; checkpoint saved", flush=True)
        return 143
    save(folder, {"step": state["step"], "runs": runs, "time": time.time()})
    print(f"RESUME done at step {state['step']} after {runs} run(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
