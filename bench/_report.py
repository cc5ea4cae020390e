"""What every benchmark records with its result: date, machine, versions; and where it goes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def context() -> dict[str, Any]:
    import ray

    from raystack import __version__

    try:
        slurm = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:  # (the GPU machine: no SLURM)
        slurm = "none"
    try:  # (the package's version is the one last installed: the checkout's commit says which code ran)
        commit = subprocess.run(
            ["git", "-C", str(RESULTS.parent), "describe", "--always", "--dirty", "--exclude=*"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        },
        "versions": {
            "raystack": __version__,
            "commit": commit or "unknown",
            "ray": ray.__version__,
            "slurm": slurm,
            "python": platform.python_version(),
        },
    }


def publish(name: str, table: str, result: dict[str, Any]) -> None:
    """Print the table and one JSON line; keep both under bench/results/<name>.{txt,json}."""
    result = {"benchmark": name, **context(), **result}
    print(table)
    print(json.dumps(result))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    header = f"{result['date']} {result['machine']} {result['versions']}"
    (RESULTS / f"{name}.txt").write_text(f"{header}\n{table}\n")


TESTBED_HOME = Path(os.environ.get("RAYSTACK_TESTBED_DIR", "/var/lib/raystack-testbed")) / "home"


def on_testbed(prefix: str, nodes: int = 4) -> Path:
    """The testbed up with `nodes` nodes, and a fresh RAYSTACK_HOME on it for this run."""
    import tempfile

    up = Path(__file__).resolve().parents[1] / "slurm" / "testbed" / "up"
    subprocess.run([str(up), "--nodes", str(nodes)], check=True, stdout=subprocess.DEVNULL)
    TESTBED_HOME.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix=prefix, dir=TESTBED_HOME))
    os.environ["RAYSTACK_HOME"] = str(home)
    return home


def bench_home(prefix: str, local: bool) -> Path:
    """A fresh RAYSTACK_HOME for this run: on the testbed (brought up), or for a local cluster
    on this machine (`--local`)."""
    if not local:
        return on_testbed(prefix)
    import tempfile

    home = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["RAYSTACK_HOME"] = str(home)
    return home
