"""The soak run with figures: the scenario of tests/testbed/soak.py at a larger scale (more jobs in
every phase), on the local testbed. Prints a table and one JSON line; keeps them in
bench/results/soak.{txt,json}.

    python bench/soak.py [--scale 3]

Pass (as the CI test): lost = 0, terminal twice = 0, ran twice = 0, reader failures = 0, the
allocation of a SIGKILLed head released within 60 s, nothing left in SLURM or on the nodes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import TESTBED_HOME, on_testbed, publish

from tests.testbed.soak import cleanup, prepare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=3, help="ok jobs per phase, times the test's")
    args = parser.parse_args()
    on_testbed("soak-bench-", nodes=4)
    soak = prepare(TESTBED_HOME / "soak-bench", scale=args.scale)
    try:
        f = soak.run()
    finally:
        cleanup(soak)
    ok = (
        f["lost"] == 0
        and f["terminal_twice"] == 0
        and f["ran_twice"] == 0
        and f["reader_failures"] == 0
        and f["head_kill_release_s"] <= 60
        and f["head_kill_gone_s"] <= 90
        and not f["left_in_slurm"]
        and not f["left_on_nodes"]
    )
    rows = [
        ("jobs", f["jobs"]),
        ("final states", f["by_state"]),
        ("lost / terminal twice / ran twice", f"{f['lost']} / {f['terminal_twice']} / {f['ran_twice']}"),
        (
            "readers (calls, failures)",
            f"{sum(f['reader_calls'].values())} {f['reader_calls']}, {f['reader_failures']}",
        ),
        ("infeasible job stuck for", f"{f.get('infeasible_stuck_s', '-')} s (grace 8 s)"),
        ("hung job stuck for", f"{f.get('hung_stuck_s', '-')} s (hang_timeout 15 s)"),
        ("head SIGKILL -> allocation released", f"{f['head_kill_release_s']} s (target <= 60)"),
        ("head SIGKILL -> every process gone", f"{f['head_kill_gone_s']} s (at most 90)"),
        ("node SIGKILL -> its job ended", f"{f['node_kill_to_job_end_s']} s"),
        ("left in SLURM / on nodes", f"{f['left_in_slurm']} / {f['left_on_nodes']}"),
        ("wall time", f"{f['seconds']} s"),
        ("pass", ok),
    ]
    table = (
        "\n".join(f"{k:40} {v}" for k, v in rows) + "\nfaults:\n" + "\n".join(f"  {x}" for x in f["faults"])
    )
    publish("soak", table, {"scale": args.scale, "pass": ok, **f})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
