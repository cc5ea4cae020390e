"""How far a command's control flow travels through the package: cross-file hops and files.

A hop is a call from code of one raystack file into a function of another raystack file (the
caller is the nearest raystack frame below the callee, so a call made through a library, e.g. a
pydantic validator, counts from the raystack code that entered the library). Every raystack
module is imported before counting, so import-time code is not counted. Two flows of the
issue on structure: `raystack up --nodes 4 --no-wait` (login side: everything before the wait
loop) on the testbed, and `raystack submit jobs/hello.yaml` into a cluster record (no cluster
needed: the job is queued). Run it against another checkout with PYTHONPATH=<checkout> to
compare (the baseline in bench/results/hops.json is cde9410's).

    python bench/hops.py [--baseline /path/to/a/worktree/of/cde9410]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import raystack

PACKAGE = str(Path(raystack.__file__).resolve().parent) + os.sep
REPO = Path(__file__).resolve().parents[1]


def import_everything() -> None:
    for mod in pkgutil.walk_packages([PACKAGE], "raystack."):
        if not mod.name.endswith("__main__"):
            with contextlib.suppress(Exception):
                importlib.import_module(mod.name)


class Hops:
    def __init__(self) -> None:
        self.hops = 0
        self.files: Counter[str] = Counter()
        self.path: list[str] = []  # the sequence of files entered by a hop

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_code.co_filename
        if not callee.startswith(PACKAGE) or frame.f_code.co_name == "<module>":
            return
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(PACKAGE):
            caller = caller.f_back
        if caller is None or caller.f_code.co_filename == callee:
            return
        name = callee.removeprefix(PACKAGE)
        self.hops += 1
        self.files[name] += 1
        self.path.append(name)


def count(argv: list[str]) -> dict[str, Any]:
    from raystack.cli import main

    hops = Hops()
    sys.argv = ["raystack", *argv]
    out, err = io.StringIO(), io.StringIO()
    sys.setprofile(hops)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code
            else:
                code = 0
    finally:
        sys.setprofile(None)
    return {
        "argv": argv,
        "exit": code,
        "hops": hops.hops,
        "files": len(hops.files),
        "by_file": dict(hops.files.most_common()),
        "stderr": err.getvalue().strip().splitlines()[-1:] if code else [],
    }


def measure(with_up: bool) -> list[dict[str, Any]]:
    """Both flows with this interpreter's raystack (its PYTHONPATH decides which checkout)."""
    home = Path(tempfile.mkdtemp(prefix="rs-hops-", dir=os.environ.get("TESTBED_HOME")))
    os.environ["RAYSTACK_HOME"] = str(home)
    import_everything()
    rows = []
    # A running SLURM job stands for the cluster's allocation (reconciliation asks SLURM about it).
    sleeper = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--job-name=rs-hops",
            f"--output={home}/sleeper.out",
            "--wrap",
            "sleep 600",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        while (
            "RUNNING"
            not in subprocess.run(
                ["squeue", "-h", "-j", sleeper, "-o", "%T"], capture_output=True, text=True
            ).stdout
        ):
            time.sleep(0.5)
        from raystack.store import cluster as records

        records.create("hops")
        fields = records.ClusterRecord.model_fields
        alloc_field = "allocation_id" if "allocation_id" in fields else "slurm_job_id"
        records.write(
            records.ClusterRecord(
                name="hops",
                state=records.ClusterState.READY,
                nodes_expected=4,
                gpus_per_node=4,
                cpus_per_node=16,
                **{alloc_field: sleeper},
            )
        )
        rows.append(count(["submit", str(REPO / "jobs" / "debug" / "hello.yaml"), "--cluster", "hops"]))
    finally:
        subprocess.run(["scancel", sleeper], check=False)
    if with_up:
        rows.append(count(["up", "--nodes", "4", "--profile", "testbed", "--name", "hops-up", "--no-wait"]))
        down = subprocess.run(
            [str(Path(sys.executable).with_name("raystack")), "down", "hops-up"],
            capture_output=True,
            text=True,
        )
        if down.returncode:
            print(f"raystack down hops-up: {down.stderr.strip()}", file=sys.stderr)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", help="another checkout (e.g. a worktree of cde9410), measured the same way"
    )
    parser.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rows_only:
        print(json.dumps(measure(with_up=True)))
        return 0
    from _report import on_testbed, publish

    on_testbed("hops-", nodes=4)
    runs = {"now": measure(with_up=True)}
    if args.baseline:
        out = subprocess.run(
            [sys.executable, __file__, "--rows-only"],
            env={**os.environ, "PYTHONPATH": args.baseline},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rev = subprocess.run(
            ["git", "-C", args.baseline, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True
        )
        runs[rev.stdout.strip() or Path(args.baseline).name] = json.loads(out.strip().splitlines()[-1])
    lines = [
        f"{'flow':8} {'checkout':10} {'hops':>5} {'files':>6}  {'without paths/files':>20}  most entered"
    ]
    for label, rows in runs.items():
        for r in rows:
            leaf = sum(n for f, n in r["by_file"].items() if f in ("store/paths.py", "store/files.py"))
            rest = len([f for f in r["by_file"] if f not in ("store/paths.py", "store/files.py")])
            top = ", ".join(f"{f} {n}" for f, n in list(r["by_file"].items())[:3])
            lines.append(
                f"{r['argv'][0]:8} {label:10} {r['hops']:5} {r['files']:6}  {r['hops'] - leaf:>9} over {rest:2} files  {top}"
            )
    publish(
        "hops",
        "\n".join(lines),
        {"runs": runs, "target": "without paths/files: up <= 20 hops over <= 8 files, submit <= 20 hops"},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
