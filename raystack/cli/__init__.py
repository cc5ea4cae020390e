"""The `raystack` command: one thin function per verb over the Python API.

Exit codes are a contract: 0 success; 1 a raystack error, a job that failed (`--follow`) or a
cluster that is not ready (`status`); 2 bad usage; 130 interrupted. Every error is one line on
stderr that names the fix; RAYSTACK_DEBUG=1 adds the traceback of an unexpected one.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

try:  # NOTE: typer 0.2x carries its own copy of click, and raises its exceptions
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover (typer with click as a dependency)
    import click.exceptions as click  # type: ignore[no-redef]

from raystack import __version__

from raystack.cli import up  # noqa: F401  # isort: skip (up and wait register first: the help lists them first)
from raystack.cli import clusters, grow, jobs, monitor, plan, specs, submit  # noqa: F401 (their verbs register on the app)
from raystack.cli.common import app, err
from raystack.client import filesystem_error
from raystack.errors import RaystackError


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    if version:
        print(f"raystack {__version__}")
        raise typer.Exit()
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit(2)


def main() -> None:
    try:
        code = app(standalone_mode=False, prog_name="raystack")
    except click.NoArgsIsHelpError as exc:  # (bare `raystack`, a group without its verb: usage)
        print(exc.format_message())
        code = 2
    except typer.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "raystack"
        text = " ".join(exc.format_message().split())
        err.print(f"{command}: error: {text} (see {command} --help)", markup=False)
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        err.print("raystack: interrupted", markup=False)
        code = 130
    except RaystackError as exc:
        err.print(f"raystack: error: {exc}", markup=False)
        code = 1
    except click.ClickException as exc:
        err.print(f"raystack: error: {exc.format_message()}", markup=False)
        code = exc.exit_code
    except Exception as exc:
        if os.environ.get("RAYSTACK_DEBUG"):
            raise
        # A file the filesystem refused (RAYSTACK_HOME missing, read-only, full) is not a bug.
        refused = filesystem_error(exc) if isinstance(exc, OSError) else None
        err.print(
            f"raystack: error: {refused}"
            if refused
            else f"raystack: internal error: {type(exc).__name__}: {exc} (a bug in raystack: rerun "
            "with RAYSTACK_DEBUG=1 for the traceback and report it)",
            markup=False,
        )
        code = 1
    sys.exit(code if isinstance(code, int) else 0)
