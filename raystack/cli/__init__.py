"""The `raystack` command: one thin function per verb over the Python API.

Exit codes are a contract: 0 success, 1 a raystack error (one line on stderr naming the fix) or
a cluster that is missing/not ready (`status`), 2 bad usage (typer's own).
"""

from __future__ import annotations

import sys

from raystack.cli import clusters, jobs, monitor, plan  # noqa: F401 (their verbs register on the app)
from raystack.cli.common import app, err
from raystack.errors import RaystackError


def main() -> None:
    try:
        app()
    except RaystackError as exc:
        err.print(f"raystack: error: {exc}", markup=False)
        sys.exit(1)
