"""Options of `raystack up` about what the cluster does once READY (checks, idleness, growth)."""

from __future__ import annotations

from typing import Annotated

import typer

MetricsOpt = Annotated[
    bool, typer.Option("--metrics", help="Ray's metrics, and Prometheus for the dashboard when found.")
]
IdleTimeoutOpt = Annotated[
    str | None,
    typer.Option(
        "--idle-timeout",
        metavar="TIME",
        help="Go down after this long with no job queued, running or attached (e.g. 30m; 0 or off: never).",
    ),
]

CanaryOpt = Annotated[
    str | None,
    typer.Option(
        "--canary",
        metavar="MODE",
        help="The NCCL all-reduce over every GPU at READY: auto (GPU clusters), strict (fail when NCCL "
        "misses the profile's fabric), off.",
    ),
]
NoCanaryOpt = Annotated[
    bool, typer.Option("--no-canary", help="Skip the interconnect canary (--canary off).")
]
MaxNodesOpt = Annotated[
    int | None,
    typer.Option(
        "--max-nodes",
        min=1,
        metavar="M",
        help="Grow up to M nodes when queued jobs need them (further allocations); release grown ones "
        "idle for --idle-timeout (5m without one).",
    ),
]
