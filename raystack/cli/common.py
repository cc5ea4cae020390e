"""What every verb of the `raystack` command shares: the app, the consoles, the options."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from raystack import __version__

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="A persistent, authenticated Ray cluster and a job queue on SLURM.",
)
# Without a terminal rich assumes 80 columns; tables of paths and URLs need more.
_WIDTH = None if sys.stdout.isatty() else 200
# NOTE: markup off: everything printed holds data (a job's last log line `[rank0]: saved to
# [/scratch/ckpt]` would be read as rich markup: lost, or a MarkupError). Style with Text.
out = Console(highlight=False, soft_wrap=True, width=_WIDTH, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

NameArg = Annotated[str | None, typer.Argument(help="Cluster name; may be omitted when there is one.")]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", "-c", help="Cluster name (default: the only one).")
]
JobArg = Annotated[str, typer.Argument(help="Job id, as printed by `raystack submit`.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


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
