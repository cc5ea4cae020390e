"""Verbs about specs and profiles, no cluster needed: check, profiles, examples."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table
from typer.core import TyperGroup

from raystack.cli.common import ClusterOpt, JsonOpt, app, complete_profile, err, out, print_json
from raystack.cli.submit import AfterOpt, SweepOpt, TakesCommand, job_argument
from raystack.client import check as checking
from raystack.spec.examples import copy_examples
from raystack.spec.planning import plan_line
from raystack.spec.profile import available_profiles, load_profile, profile_path
from raystack.spec.values import duration_text
from raystack.spec.workdir import left_out_note

ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-P",
        metavar="NAME",
        help="Check against the cluster this profile makes.",
        autocompletion=complete_profile,
    ),
]
NodesOpt = Annotated[int | None, typer.Option("--nodes", "-N", min=1, metavar="N", help="With --profile.")]
GpusOpt = Annotated[int | None, typer.Option("--gpus-per-node", min=0, metavar="N", help="With --profile.")]
CpusOpt = Annotated[int | None, typer.Option("--cpus-per-node", min=1, metavar="N", help="With --profile.")]


@app.command(cls=TakesCommand, short_help="Validate a job spec (and its plan) without a cluster.")
def check(
    ctx: typer.Context,
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SPEC.yaml | -- COMMAND", show_default=False, help="A job spec, or a command after --."
        ),
    ] = None,
    cluster: ClusterOpt = None,
    profile: ProfileOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
    cpus_per_node: CpusOpt = None,
    sets: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Override a spec field: key.sub=value."),
    ] = None,
    sweep: SweepOpt = None,
    after: AfterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate a job spec (or command) and its plan as `submit` would, without a running cluster:
    against a cluster's record (--cluster, $RAYSTACK_CLUSTER, the only one), or against the
    cluster a profile would make (--profile [--nodes N]); with --sweep every combination, as
    submit would queue them. Nothing is queued. Exit 1 when it could not run there, naming the
    field and the fix."""
    job_input = job_argument(ctx, list(args or []))
    target = checking.shape(cluster, profile, nodes, gpus_per_node, cpus_per_node)
    done = checking.check(job_input, sets or [], target, sweep, after)
    request = done.prepared.request
    line = plan_line(done.cluster, request)
    if as_json:
        print_json(
            {
                "ok": True,
                "against": done.against,
                "request": request.model_dump(mode="json", exclude={"id", "nonce", "queued_at"}),
                "plan": line or None,
                "jobs": done.jobs,
            }
        )
        return
    sweep_words = f" (its sweep: {done.jobs} jobs, each checked; the first shown)" if done.jobs > 1 else ""
    out.print(f"ok: {request.name} can run on {done.against}{sweep_words}", markup=False)
    out.print(f"  entrypoint: {request.planned or request.entrypoint}", markup=False)
    if request.working_dir:
        out.print(f"  working_dir: {request.working_dir} (uploaded to every node)", markup=False)
    if request.left_out:
        out.print(f"  note: {left_out_note(request.left_out)}", markup=False)
    if line:
        out.print(f"  plan: {line}", markup=False)
    limits = [
        f"{label} {duration_text(value)}"
        for label, value in (("timeout", request.timeout), ("min_time", request.min_time))
        if value
    ]
    if limits:
        out.print(f"  {', '.join(limits)}", markup=False)


class _ProfilesGroup(TyperGroup):
    """`raystack profiles NAME` shows that profile, as `raystack profiles show NAME` does."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["show", *args]
        return super().resolve_command(ctx, args)


profiles_app = typer.Typer(
    cls=_ProfilesGroup,
    rich_markup_mode=None,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="The cluster profiles: a site's sbatch defaults, setup and environment.",
)
app.add_typer(profiles_app, name="profiles", short_help="List the cluster profiles, or show one.")


@profiles_app.callback()
def profiles(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List every profile `up --profile` finds (yours in ~/.config/raystack/profiles first)."""
    if ctx.invoked_subcommand is not None:
        return
    rows = []
    for name in available_profiles():
        path = profile_path(name)
        try:
            description = load_profile(name).description
        except Exception as exc:  # (a broken profile of the user's is listed with its error)
            description = f"cannot be loaded: {exc}"
        rows.append({"name": name, "path": str(path), "description": description})
    if as_json:
        print_json(rows)
        return
    table = Table("profile", "description", "file")
    for row in rows:
        table.add_row(row["name"], row["description"], row["path"])
    out.print(table)
    err.print("  one of them: raystack profiles NAME; use it: raystack up --profile NAME", markup=False)


@profiles_app.command("show")
def show(
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help="A profile, or a .yaml file.", autocompletion=complete_profile),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Every setting of one profile, defaults included, and the file it comes from."""
    prof = load_profile(name)
    values = prof.model_dump(mode="json")
    if as_json:
        print_json({"path": str(profile_path(name)), **values})
        return
    out.print(f"# {profile_path(name)}", markup=False)
    out.print(yaml.safe_dump(values, sort_keys=False, default_flow_style=False).rstrip(), markup=False)


@app.command(short_help="Copy the example job specs (and their scripts) into a folder to try.")
def examples(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="Where to copy them (made if missing).")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite files of the same names.")] = False,
) -> None:
    """The debug jobs raystack ships (hello, actors, placement, spmd, zero3, faults, ...): each
    spec with the script it runs. Nothing there is overwritten unless --force."""
    copied = copy_examples(folder, force)
    out.print(f"copied {len(copied)} files into {folder}", markup=False)
    specs = sorted(p.name for p in copied if p.suffix == ".yaml")
    err.print(f"  specs: {', '.join(specs)}", markup=False)
    err.print(f"  try one: raystack submit {folder / 'hello.yaml'} -f", markup=False)
