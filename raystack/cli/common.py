"""What every verb of the `raystack` command shares: the app, the consoles, the options."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer
import typer.core
from rich.console import Console
from rich.text import Text

from raystack.errors import ConfigError

# NOTE: typer 0.29 writes a Python type beside every argument and option without a metavar in
# --help ("JOB <str>", "<list[str]>", "--lines <int>") and braces around required arguments in the
# usage line ("{JOB}"): raystack's arguments carry metavars that say what they take, and options
# without one get click's words (N, NUMBER, TEXT).
_WORDS = {"int": "N", "float": "NUMBER", "str": "TEXT", "Path": "PATH"}


def _option_word(self: Any, ctx: Any) -> str:
    return self.metavar or _WORDS.get(self.bare_type().removeprefix("list[").removesuffix("]"), "VALUE")


def _usage_name(self: Any) -> str:
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


for _cls, _attr, _fn in (
    (typer.core.TyperArgument, "display_type_rich", lambda self, ctx: ""),
    (typer.core.TyperOption, "display_type_rich", _option_word),
    (typer.core.TyperArgument, "_usage_display_name", _usage_name),
):
    if hasattr(_cls, _attr) and hasattr(_cls, "bare_type"):
        setattr(_cls, _attr, _fn)

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    help="A persistent, authenticated Ray cluster and a job queue on SLURM.",
)
# Without a terminal rich assumes 80 columns; tables of paths and URLs need more.
_WIDTH = None if sys.stdout.isatty() else 200
# NOTE: markup off: everything printed holds data (a job's last log line `[rank0]: saved to
# [/scratch/ckpt]` would be read as rich markup: lost, or a MarkupError). Style with Text.
# A terminal's escape sequences (CSI `ESC[2J`, OSC titles and links, two-character escapes).
ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """Text that came from a job or a user (a log's last line in a message, a name, an env value)
    as raystack renders it: terminal escape sequences removed, other control characters written
    escaped (`\\x07`), so nothing shown can clear, move or recolour the screen. `logs` is not
    rendered: it prints the log's bytes as they are, like cat."""
    return CONTROLS.sub(lambda m: repr(m.group(0))[1:-1], ESCAPES.sub("", text))


class Screen(Console):
    """A console whose every string (printed, or in a table's cell) goes through `shown`."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(shown(text), **kwargs)


out = Screen(highlight=False, soft_wrap=True, width=_WIDTH, markup=False, emoji=False)
err = Screen(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


# Shell completion (`raystack --install-completion`: bash, zsh, fish): what a word can be, read
# from RAYSTACK_HOME and the profile folders; nothing is asked of SLURM or Ray.
def complete_cluster(incomplete: str) -> list[str]:
    """Cluster names in RAYSTACK_HOME."""
    from raystack.client import Cluster

    try:
        return [n for n in Cluster.names() if n.startswith(incomplete)]
    except Exception:  # (completion must never print a traceback into the user's line)
        return []


def complete_job(ctx: typer.Context, incomplete: str) -> list[str]:
    """Job and sweep ids of the cluster named on the line (-c NAME), else of every cluster, newest
    first."""
    from raystack.client import Cluster

    given = ctx.params.get("cluster")
    ids: list[str] = []
    for name in [given] if given else complete_cluster(""):
        try:
            records = Cluster(name).jobs()
        except Exception:
            continue
        for r in reversed(records):
            ids += [i for i in (r.id, r.request.sweep) if i and i not in ids]
    return [i for i in ids if i.startswith(incomplete)]


def complete_profile(incomplete: str) -> list[str]:
    from raystack.spec.profile import available_profiles

    return [p for p in available_profiles() if p.startswith(incomplete)]


CLUSTER_HELP = "Cluster name.  [default: $RAYSTACK_CLUSTER, else the only live cluster]"
NameArg = Annotated[
    str | None,
    typer.Argument(metavar="CLUSTER", show_default=False, help=CLUSTER_HELP, autocompletion=complete_cluster),
]
ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        "-c",
        metavar="NAME",
        show_default=False,
        help=CLUSTER_HELP,
        autocompletion=complete_cluster,
    ),
]
JobArg = Annotated[
    str,
    typer.Argument(
        metavar="JOB", help="Job id, as printed by `raystack submit`.", autocompletion=complete_job
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
ParsableOpt = Annotated[
    bool, typer.Option("--parsable", help="Print the id alone on stdout (as sbatch --parsable): ID=$(...).")
]


def cluster_name(positional: str | None, option: str | None) -> str | None:
    """The cluster a verb is about: its positional name or --cluster/-c (both mean the same)."""
    if positional is not None and option is not None and positional != option:
        raise ConfigError(f"two clusters named: '{positional}' and --cluster '{option}'; give one")
    return positional if positional is not None else option  # ('' stays '': refused, never the default)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


@contextlib.contextmanager
def on_interrupt(what_goes_on: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C while following or waiting ends the command, not what it watched: say so (exit 130)
    with what goes on and how to stop it. `what_goes_on` is asked only then (one read)."""
    try:
        yield
    except KeyboardInterrupt:
        try:
            note = what_goes_on()
        except Exception as exc:  # (the record unreadable: the plain word, and why)
            note = f"(its state was not read: {type(exc).__name__})"
        err.print(f"raystack: interrupted; {note}", markup=False)
        raise typer.Exit(130) from None
