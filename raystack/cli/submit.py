"""`raystack submit`: a spec file or a command after --, with `ray job submit`'s own flags,
sweeps and dependencies."""

from __future__ import annotations

import difflib
import errno
import json
import os
import shlex
import stat
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from typer.core import TyperCommand

from raystack.cli.common import ClusterOpt, JsonOpt, ParsableOpt, app, err, on_interrupt, print_json
from raystack.client import Cluster, Job, JobRecord, JobState
from raystack.errors import ConfigError
from raystack.spec.job import name_problem
from raystack.spec.planning import plan_line
from raystack.spec.workdir import left_out_note


class TakesCommand(TyperCommand):
    """A verb whose command comes after `--`, verbatim (as `ray job submit -- ...` takes it):
    keeps the raw argv and how many words came after the `--` for the verb to check."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["raw_args"] = list(args)
        ctx.meta["after_dashes"] = len(args) - args.index("--") - 1 if "--" in args else None
        return super().parse_args(ctx, args)


def job_argument(ctx: typer.Context, args: list[str]) -> str | list[str]:
    """A spec file, or the command after `--`. A bare command without `--` is refused (its own
    flags would be read as raystack's: `-c config.yaml` as the cluster), and so is a spec
    file that does not exist, before anything is read or queued."""
    after = ctx.meta.get("after_dashes")
    verb = ctx.command_path  # raystack submit, raystack check
    before, command = (args, []) if after is None else (args[: len(args) - after], args[len(args) - after :])
    if after is not None:
        _one_word_pairs(ctx.meta.get("raw_args", args), after)
        if before:
            raise ConfigError(f"{before[0]!r} before --: give a job spec or a command after --, not both")
        if not command:
            raise ConfigError(f"nothing after --: give the command, e.g. {verb} -- python train.py")
        if not command[0].strip():  # (`-- "$CMD"` with CMD unset: a shell would find no program)
            raise ConfigError(
                f"the command after -- starts with an empty word ({command[0]!r}: an unset variable?); "
                f"give the program, e.g. {verb} -- python train.py"
            )
        return command
    if not before:
        raise ConfigError(f"give a job spec or a command after --: {verb} job.yaml, {verb} -- python x.py")
    if before[0].lower().endswith((".yaml", ".yml")):
        if not Path(before[0]).is_file():
            raise ConfigError(_not_a_spec(before[0]))
        if len(before) > 1 and before[1].lower().endswith((".yaml", ".yml")):
            raise ConfigError(f"one job spec per submit: {before[0]}, then {before[1]} on its own")
        if len(before) > 1:  # (an option's value split by a space: --set env.LR 1e-6)
            raise ConfigError(
                f"{before[1]!r} after the job spec {before[0]}: each option takes one word "
                "(--set KEY=VALUE, --sweep KEY=V1,V2: no spaces, or quote them)"
            )
        return before[0]
    if Path(before[0]).is_dir():
        specs = sorted(str(p) for p in Path(before[0]).iterdir() if p.suffix.lower() in (".yaml", ".yml"))
        some = f" (e.g. {', '.join(specs[:3])})" if specs else ""
        raise ConfigError(f"{before[0]!r} is a folder, not a job spec: give a .yaml file in it{some}")
    raw = ctx.meta.get("raw_args", before)
    i = raw.index(before[0]) if before[0] in raw else len(raw)
    run = ["python"] if before[0].endswith(".py") else []  # (a script: its interpreter goes first)
    fix = shlex.join([*verb.split(), *raw[:i], "--", *run, *raw[i:]])  # (raystack submit, raystack check)
    near = _nearest_spec(before[0]) if len(before) == 1 else ""
    raise ConfigError(f"{before[0]!r} is not a job spec (.yaml); a command goes after --: {fix}{near}")


def _not_a_spec(given: str) -> str:
    """Why a .yaml path given as the job spec cannot be read as one: missing, or not a file."""
    path = Path(given)
    if path.is_symlink() and not path.exists():  # (a link to nothing, or to itself)
        why = f"points to {os.readlink(path)!r}, which does not exist"
        try:
            path.resolve(strict=True)
        except RuntimeError:  # (Python 3.11 and 3.12: a loop)
            why = "is a loop of symbolic links"
        except OSError as exc:
            why = "is a loop of symbolic links" if exc.errno == errno.ELOOP else why
        return f"job spec {given!r} {why}: give a YAML file"
    if not path.exists():
        return f"no job spec {given!r} (no such file){_nearest_spec(given)}"
    mode = path.stat().st_mode
    what = (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "not a regular file"
    )
    return f"job spec {given!r} is {what}: give a YAML file"


def _one_word_pairs(raw: list[str], after: int) -> None:
    """`--set env.LR 1 -- cmd` (a space where the = goes): the 1 would be taken for the job."""
    mine = raw[: len(raw) - after - 1]
    for option, value, nxt in zip(mine, mine[1:], [*mine[2:], None], strict=False):
        if option in ("--set", "--sweep") and "=" not in value and nxt and not nxt.startswith("-"):
            raise ConfigError(f"{option} {value}: each option takes one word: {option} {value}={nxt}")


def _nearest_spec(given: str) -> str:
    """'; did you mean X?' for a spec file whose name is close to `given`, else ''."""
    folder = Path(given).parent
    names = (
        [p.name for p in folder.glob("*") if p.suffix.lower() in (".yaml", ".yml")] if folder.is_dir() else []
    )
    close = difflib.get_close_matches(Path(given).name, names, n=1, cutoff=0.75)
    return f"; did you mean {folder / close[0] if str(folder) != '.' else close[0]}?" if close else ""


# The options of `submit`, one alias each; `ray job submit`'s flags mean what they mean there.
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="Override a spec field: key.sub=value.")
]
FollowOpt = Annotated[
    bool, typer.Option("--follow", "-f", help="Stream the log; exit with the job's outcome.")
]
NowOpt = Annotated[
    bool, typer.Option("--now", help="Skip the queue: submit as soon as the cluster is READY.")
]
SweepOpt = Annotated[
    list[str] | None,
    typer.Option("--sweep", metavar="KEY=V1,V2", help="One job per value (repeat: every combination)."),
]
AfterOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--after", metavar="ID[:ok|:any|:notok]", help="Wait for a job or sweep to end so (repeatable)."
    ),
]
WorkingDirOpt = Annotated[
    str | None,
    typer.Option("--working-dir", metavar="DIR", help="Uploaded to every node (as ray job submit)."),
]
CpusOpt = Annotated[
    float | None, typer.Option("--entrypoint-num-cpus", min=0, metavar="N", help="CPUs for the driver.")
]
GpusOpt = Annotated[
    float | None, typer.Option("--entrypoint-num-gpus", min=0, metavar="N", help="GPUs for the driver.")
]
MemoryOpt = Annotated[
    str | None, typer.Option("--entrypoint-memory", metavar="BYTES", help="Memory for the driver (or 4G).")
]
ResourcesOpt = Annotated[
    str | None, typer.Option("--entrypoint-resources", metavar="JSON", help="Other resources for the driver.")
]
MetadataOpt = Annotated[str | None, typer.Option("--metadata-json", metavar="JSON", help="Ray job metadata.")]
RuntimeEnvOpt = Annotated[
    Path | None, typer.Option("--runtime-env", metavar="FILE", help="Ray's runtime_env, a YAML or JSON file.")
]
RuntimeEnvJsonOpt = Annotated[
    str | None, typer.Option("--runtime-env-json", metavar="JSON", help="Ray's runtime_env.")
]
NameOpt = Annotated[
    str | None,
    typer.Option("--name", metavar="NAME", help="The job's name (as --set name=NAME; its id: NAME-<8 hex>)."),
]
SubmissionIdOpt = Annotated[
    str | None, typer.Option("--submission-id", metavar="ID", help="The job's id (default: <name>-<8 hex>).")
]
# sbatch's letters, as a SLURM user types them at submit: each means a spec field, or is the cluster's.
JobNodesOpt = Annotated[
    int | None,
    typer.Option(
        "--nodes", "-N", min=1, metavar="N", help="As sbatch -N: nodes (kind spmd), else needs.nodes."
    ),
]
JobTimeOpt = Annotated[
    str | None,
    typer.Option("--time", "-t", metavar="TIME", help="As sbatch -t: the job's timeout (10 = 10 min)."),
]
JobGpusOpt = Annotated[
    int | None, typer.Option("--gpus", "-G", min=0, metavar="N", help="As sbatch --gpus: needs.gpus.")
]
JobPartitionOpt = Annotated[
    str | None,
    typer.Option(
        "--partition", "-p", metavar="NAME", hidden=True, help="Refused: the partition is the cluster's."
    ),
]
NoWaitOpt = Annotated[bool, typer.Option("--no-wait", help="Return once queued (the default).")]
SecretOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--secret",
        metavar="NAME",
        help="A variable of this environment for the job (WANDB_API_KEY), never written down (repeatable).",
    ),
]


@app.command(cls=TakesCommand, short_help="Queue a job: a spec file, or a command after --.")
def submit(
    ctx: typer.Context,
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SPEC.yaml | -- COMMAND", show_default=False, help="A job spec, or a command after --."
        ),
    ] = None,
    cluster: ClusterOpt = None,
    name: NameOpt = None,
    sets: SetOpt = None,
    sweep: SweepOpt = None,
    after: AfterOpt = None,
    working_dir: WorkingDirOpt = None,
    entrypoint_num_cpus: CpusOpt = None,
    entrypoint_num_gpus: GpusOpt = None,
    entrypoint_memory: MemoryOpt = None,
    entrypoint_resources: ResourcesOpt = None,
    metadata_json: MetadataOpt = None,
    runtime_env: RuntimeEnvOpt = None,
    runtime_env_json: RuntimeEnvJsonOpt = None,
    submission_id: SubmissionIdOpt = None,
    secret: SecretOpt = None,
    nodes: JobNodesOpt = None,
    time: JobTimeOpt = None,
    gpus: JobGpusOpt = None,
    partition: JobPartitionOpt = None,
    no_wait: NoWaitOpt = False,
    follow: FollowOpt = False,
    now: NowOpt = False,
    as_json: JsonOpt = False,
    parsable: ParsableOpt = False,
) -> None:
    """Queue a job (a spec file, or a command after --) on the cluster; it may still be PENDING in
    SLURM. ray job submit's flags add to the spec (--working-dir, --entrypoint-num-cpus/-gpus/
    -memory, --entrypoint-resources, --metadata-json, --runtime-env[-json], --submission-id);
    sbatch's -N, -t and --gpus set the spec's nodes (needs.nodes), timeout and needs.gpus; --sweep:
    one job per value, --after: wait for other jobs, --secret NAME: a variable, never written down."""
    job_input = job_argument(ctx, list(args or []))
    if name is not None and (why := name_problem(name)):
        raise ConfigError(f"--name {why}")
    flags = {
        "name": name,
        "working_dir": _absolute(working_dir),
        "entrypoint_num_cpus": entrypoint_num_cpus,
        "entrypoint_num_gpus": entrypoint_num_gpus,
        "entrypoint_memory": entrypoint_memory,
        "entrypoint_resources": _json("--entrypoint-resources", entrypoint_resources),
        "metadata": _json("--metadata-json", metadata_json),
    }
    extra = [f"{k}={json.dumps(v)}" for k, v in flags.items() if v is not None]
    extra += runtime_env_sets(runtime_env, runtime_env_json)
    extra += letter_sets(job_input, nodes, time, gpus, partition)
    target = Cluster.get(cluster)
    given: dict[str, Any] = {"now": now, "sweeps": sweep, "after": after, "job_id": submission_id}
    jobs = target.submit_jobs(job_input, sets=[*extra, *(sets or [])], secrets=secret, **given)
    _tell(target, jobs, follow, "parsable" if parsable else "json" if as_json else "text")
    if follow:
        with on_interrupt(lambda: what_goes_on(jobs)):
            exit_for(jobs[0].follow() if len(jobs) == 1 else _follow_many(jobs))


def letter_sets(
    job_input: str | list[str], nodes: int | None, time: str | None, gpus: int | None, partition: str | None
) -> list[str]:
    """sbatch's -N, -t and --gpus as --set overrides of the fields that mean them: -N is the
    launcher's node count of a kind: spmd job (`nodes`), else the nodes it occupies
    (`needs.nodes`); -t the job's `timeout` (SLURM's forms: 10 is 10 minutes); --gpus `needs.gpus`.
    -p is refused: the partition is the cluster's."""
    if partition is not None:
        raise ConfigError(
            f"-p/--partition {partition}: a job runs on its cluster's nodes, and the partition is the "
            f"cluster's: raystack up -p {partition} (or a profile's partition:), then submit to that cluster"
        )
    sets = []
    if nodes is not None:
        spmd = isinstance(job_input, str) and _kind(Path(job_input)) == "spmd"
        sets.append(f"{'nodes' if spmd else 'needs.nodes'}={nodes}")
    if time is not None:
        sets.append(f"timeout={json.dumps(time)}")
    if gpus is not None:
        sets.append(f"needs.gpus={gpus}")
    return sets


def _kind(spec: Path) -> str:
    try:
        data = yaml.safe_load(spec.read_text())
    except (OSError, yaml.YAMLError):
        return "ray"  # (the spec's own reading says what is wrong with it)
    return str(data.get("kind", "ray")) if isinstance(data, dict) else "ray"


def what_goes_on(jobs: list[Job]) -> str:
    """What a Ctrl-C of a follow leaves going on, and the commands for it."""
    first = jobs[0].record()
    if first.request.sweep and len(jobs) > 1:
        return (
            f"sweep {first.request.sweep} goes on; follow a job again: raystack logs ID -f, "
            f"stop the rest: raystack cancel {first.request.sweep}"
        )
    if first.state.is_terminal():
        return f"job {first.id} ended {first.state.value}"
    return (
        f"job {first.id} is still {first.state.value}; follow it again: raystack logs {first.id} -f, "
        f"stop it: raystack stop {first.id}"
    )


def exit_for(record: JobRecord) -> None:
    """`--follow` and `logs -f` exit with the job's outcome: 0 only when it SUCCEEDED."""
    if record.state is not JobState.SUCCEEDED:
        err.print(f"job {record.id} {record.state.value}: {record.message}", markup=False)
        raise typer.Exit(1)


def _follow_many(jobs: list[Job]) -> JobRecord:
    """A sweep followed: each job's log in turn; the first that did not succeed, else the last."""
    records = [job.follow() for job in jobs]
    return next((r for r in records if r.state is not JobState.SUCCEEDED), records[-1])


def _tell(target: Cluster, jobs: list[Job], follow: bool, how: str) -> None:
    """What submit says: text on stderr, or JSON, or (parsable) the ids alone, one a line."""
    if how == "parsable":
        print("\n".join(job.id for job in jobs), flush=True)
        return
    rows = [
        {
            "id": job.id,
            "cluster": job.cluster,
            "state": (job.seen or job.record()).state.value,
            "position": job.queued_place if job.queued_place is not None else job.position(),
        }
        for job in jobs
    ]
    if how == "json":
        print_json(rows[0] if len(rows) == 1 else rows)
        return
    first = jobs[0].seen or jobs[0].record()
    if first.request.sweep:
        err.print(
            f"queued sweep {first.request.sweep} on cluster {target.name}: {len(jobs)} jobs, "
            f"{jobs[0].id} ... {jobs[-1].id}",
            markup=False,
        )
    else:
        pos = rows[0]["position"]
        position = "next" if pos == 1 else f"position {pos}" if pos else "submitting now"
        err.print(f"queued job {jobs[0].id} on cluster {target.name} ({position})", markup=False)
    if jobs[0].queued_note:
        err.print(f"  note: {jobs[0].queued_note}", markup=False)
    if first.request.left_out:
        err.print(f"  note: {left_out_note(first.request.left_out)}", markup=False)
    if first.request.after:
        err.print(f"  after: {', '.join(first.request.after)}", markup=False)
    if first.request.plan:
        err.print(f"  plan: {plan_line(target.snapshot(), first.request)}", markup=False)
    if not follow:
        what = first.request.sweep or jobs[0].id
        err.print(
            f"  follow it: raystack logs {jobs[0].id} -f    stop it: raystack cancel {what}", markup=False
        )


def _absolute(folder: str | None) -> str | None:
    """--working-dir is relative to where the command runs (as ray job submit takes it)."""
    if folder is None or "://" in folder:
        return folder
    return str(Path(folder).expanduser().resolve())


def _json(flag: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag}: not JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f'{flag}: give a JSON object, e.g. {{"key": "value"}}')
    return value


def runtime_env_sets(path: Path | None, text: str | None) -> list[str]:
    """--runtime-env FILE / --runtime-env-json as --set items, key by key (they join the spec's
    runtime_env; env_vars join variable by variable). Local paths are the current folder's."""
    renv: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"--runtime-env {path}: not UTF-8 text (byte {exc.start}): save it as UTF-8 YAML or JSON"
            ) from None
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--runtime-env {path}: cannot read it ({exc})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"--runtime-env {path}: not a mapping of runtime_env keys")
        renv.update(loaded)
    if text is not None:
        given = _json("--runtime-env-json", text)
        env = {**(renv.get("env_vars") or {}), **(given.pop("env_vars", None) or {})}
        renv.update(given)
        if env:
            renv["env_vars"] = env
    for key in ("working_dir", "pip", "uv", "conda"):
        value = renv.get(key)
        if isinstance(value, str) and "://" not in value and Path(value).expanduser().exists():
            renv[key] = str(Path(value).expanduser().resolve())
    if isinstance(renv.get("py_modules"), list):
        renv["py_modules"] = [
            str(Path(m).expanduser().resolve()) if isinstance(m, str) and "://" not in m else m
            for m in renv["py_modules"]
        ]
    items = [f"runtime_env.env_vars.{k}={v}" for k, v in (renv.pop("env_vars", None) or {}).items()]
    return [*(f"runtime_env.{k}={json.dumps(v)}" for k, v in renv.items()), *items]
