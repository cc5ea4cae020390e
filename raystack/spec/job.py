"""Job specs (jobs/*.yaml): typed, validated on load, overridable with `--set key.sub=value`.

A spec is resolved against the submitter's filesystem and the live cluster *before* anything is
queued: working_dir must exist and fit Ray's upload limit, outputs become absolute paths on the
shared filesystem, and `needs` must fit the cluster. Every problem is one ConfigError line that
names the file, the field and the fix.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import shlex
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raystack.durations import off_or_duration, parse_duration
from raystack.errors import ConfigError
from raystack.launch.launchers import misuse
from raystack.spec.needs import Needs, Resume
from raystack.spec.planning import PLACEHOLDER, PlanSpec
from raystack.spec.submission import DRIVER_PREFIX
from raystack.spec.values import (
    ENV_NAME,
    RAW_TEXT_PATHS,
    SpecModel,
    alias,
    parse_yaml,
    quote,
    size_to_mb,
    validate_env,
)
from raystack.store import paths

# The keys of Ray's runtime_env (ray.runtime_env.RuntimeEnv) a job may give.
RUNTIME_ENV_KEYS = (
    "working_dir",
    "py_modules",
    "py_executable",
    "excludes",
    "pip",
    "uv",
    "conda",
    "container",
    "image_uri",
    "env_vars",
    "config",
    "nsight",
    "rocprof_sys",
    "worker_process_setup_hook",
    "java_jars",
)
MAX_SWEEP = 1000  # jobs in one sweep
AFTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}(:(ok|any|notok))?")


MAX_ARG = 128 * 1024  # bytes in one argument of execve (MAX_ARG_STRLEN): the entrypoint is one


# Keys people bring from Ray's CLI, SkyPilot or SLURM, and where a job spec takes what they mean
# (the unknown-key error says so instead of guessing a spelling).
_NEEDS = "a job's GPUs, CPUs and nodes go under needs: (needs.gpus, needs.gpus_per_node, needs.nodes)"
_RUNTIME_ENV = "Ray's runtime_env keys go under runtime_env: (runtime_env.pip, runtime_env.conda, ...)"
ELSEWHERE = {
    **dict.fromkeys(("resources", "gpus", "num_gpus", "cpus", "num_cpus", "accelerators"), _NEEDS),
    **dict.fromkeys(("pip", "conda", "py_modules", "image_uri", "container", "py_executable"), _RUNTIME_ENV),
    **dict.fromkeys(("env_vars", "environment", "envs"), "raystack calls it env"),
    **dict.fromkeys(
        ("workdir", "work_dir", "cwd", "working_directory", "chdir"), "raystack calls it working_dir"
    ),
    **dict.fromkeys(("depends_on", "dependencies", "dependency"), "raystack calls it after: [JOB_ID, ...]"),
    **dict.fromkeys(("max_retries", "retry"), "raystack calls it retries"),
    **dict.fromkeys(
        ("time", "walltime", "time_limit", "max_time"),
        "timeout: stops the job after a duration; the cluster's walltime is `raystack up --time`",
    ),
    **dict.fromkeys(("cmd", "run", "script", "entry_point"), "entrypoint (kind ray) or command (kind spmd)"),
    **dict.fromkeys(
        ("nproc_per_node", "nprocs_per_node", "ntasks_per_node", "num_processes"),
        "raystack calls it procs_per_node (kind spmd)",
    ),
    **dict.fromkeys(("num_nodes", "nnodes"), "nodes (kind spmd) or needs.nodes"),
    **dict.fromkeys(
        ("submission_id", "job_id", "id"),
        "a job's id is `raystack submit --submission-id ID`; name: names it",
    ),
}


def name_problem(value: str) -> str | None:
    """Why `value` cannot be a job's name (it starts the job's id and file names), else None."""
    fault = paths.name_fault(value)
    return f"{quote(value)} is not a job name: {fault}" if fault else None


class JobSpec(SpecModel):
    """One job: what to run, with what environment, needing what, with which outputs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str
    """The job's name (default: the spec file's name); its id is <name>-<8 hex digits>. At most 63
    letters, digits, '.', '_', '-'."""
    kind: Literal["ray", "spmd"] = "ray"
    """`ray`: a Ray driver (entrypoint); `spmd`: a launcher on every node (launcher, command)."""
    entrypoint: str = ""
    """kind ray: the driver's shell command, run on the head with the working_dir as its folder."""
    launcher: Literal["torchrun", "deepspeed", "accelerate"] | None = None
    """kind spmd: the launcher raystack starts on every node with the rendezvous filled in."""
    command: str | None = None
    """kind spmd: after the launcher, the training script and its arguments, verbatim."""
    launcher_args: list[str] = Field(default_factory=list)
    """kind spmd: the launcher's own arguments, e.g. ["--use_deepspeed"] for accelerate (or one
    line, split as the shell splits it)."""
    nodes: int | None = Field(default=None, ge=1)
    """kind spmd: nodes to run on (default: every node of the cluster)."""
    procs_per_node: int | None = Field(default=None, ge=1)
    """kind spmd: processes per node (default: the node's GPUs, or 1)."""
    working_dir: str | None = None
    """A folder uploaded to every node (relative to the spec's folder; .gitignore and excludes
    honoured; at most 500 MB)."""
    excludes: list[str] = Field(default_factory=list)
    """Patterns left out of the working_dir upload, besides the defaults (.git, venvs, env/,
    caches, checkpoints, outputs, *.pt, *.bin); `!env/` takes a default back. One pattern may
    be given as a string."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of the driver and every worker (values as written; Ray expands $VAR)."""
    secrets: list[str] = Field(default_factory=list)
    """Environment variables taken from your environment at submit (WANDB_API_KEY, HF_TOKEN) for the
    driver and an SPMD job's ranks; kept in a 0600 file until the job ends, never in the ledger, the
    logs or Ray's runtime_env (`submit --secret NAME`)."""
    entrypoint_num_cpus: float = Field(default=0, ge=0)
    """CPUs reserved for the driver (Ray's --entrypoint-num-cpus)."""
    entrypoint_num_gpus: float = Field(default=0, ge=0)
    """GPUs reserved for the driver (Ray's --entrypoint-num-gpus)."""
    entrypoint_resources: dict[str, float] = Field(default_factory=dict)
    """Other Ray resources for the driver; one no node has is refused at submit."""
    entrypoint_memory: int = Field(default=0, ge=0)
    """Memory reserved for the driver, in bytes or as a size (4G) (Ray's --entrypoint-memory)."""
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    """Ray's runtime_env as Ray takes it (pip, uv, conda, py_modules, py_executable, image_uri,
    container, nsight, config, ...), validated by Ray's own RuntimeEnv at submit and merged with
    what raystack sets: its working_dir, env_vars and excludes join the spec's own."""
    metadata: dict[str, str] = Field(default_factory=dict)
    """Ray job metadata shown by the dashboard and `ray job list` (raystack's own keys win)."""
    needs: Needs = Field(default_factory=Needs)
    """What the job needs from the cluster, checked before it is queued."""
    timeout: float | None = None
    """Stop the job after this long (a duration; 0/off: never)."""
    retries: int = Field(default=0, ge=0, le=100)
    """Run a job that FAILED within retry_window of its start again, up to this many times."""
    retry_window: float | None = None
    """How soon after its start a failure is retried (default 5m; 0/off: any failure)."""
    hang_timeout: float | None = None
    """Suspect a hang when the job makes no progress this long: no output, and nothing of it moves
    (a variable of a thread that runs, a stack, a file, a GPU's memory: busy CPUs and GPUs alone are
    no progress); its stacks are dumped (default: the profile's; 0/off: never)."""
    hang_action: Literal["stop", "warn"] | None = None
    """What a suspected hang does: stop (FAILED `hung: ...`, unless it moved while its stacks were
    dumped) or warn (the job runs on, its message says since when; moving again clears it)
    (default: the profile's, stop)."""
    infeasible_grace: float | None = None
    """Stop the job when a demand of it fits no node this long (default: the profile's, 60s; 0/off: never)."""
    stop_grace: float = 30.0
    """Time between SIGTERM and kill on `raystack stop` and at the walltime warning (at least 1s)."""
    outputs: dict[str, str] = Field(default_factory=dict)
    """Named paths made absolute on the shared filesystem and exported as RAYSTACK_OUTPUT_<NAME>."""
    uv: bool = False
    """Let Ray run workers with `uv run` (RAY_ENABLE_UV_RUN_RUNTIME_ENV)."""
    min_time: float | None = None
    """Walltime left that the job needs to be worth starting; it waits for the next allocation otherwise."""
    resume: Resume = Field(default_factory=Resume)
    """How the job is submitted again after a walltime interruption."""
    plan: PlanSpec | None = None
    sweep: dict[str, list[Any]] = Field(default_factory=dict)
    """One job per combination of these values, e.g. {env.LR: [1e-6, 3e-6], env.SEED: [1, 2]}:
    4 jobs of one sweep, with ids <name>-<sweep>-<k> (as `submit --sweep env.LR=1e-6,3e-6`)."""
    after: list[str] = Field(default_factory=list)
    """Jobs (or sweeps) this one waits for, as SLURM's dependencies: ID or ID:ok (it SUCCEEDED),
    ID:any (it ended), ID:notok (it FAILED, STOPPED or was CANCELLED)."""
    """A layout the planner computes from the cluster, filled into {plan.*} in the entrypoint."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if why := name_problem(value):
            raise ValueError(why)
        return value

    @field_validator("entrypoint", "command", mode="before")
    @classmethod
    def _one_line(cls, value: Any) -> Any:
        if isinstance(value, list) and all(isinstance(w, str | int | float) for w in value):
            line = shlex.join(str(w) for w in value)
            raise ValueError(f"is a list; give the command as one line: {line}")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("kind", "ray") == "ray" and not value.strip():
            raise ValueError("is empty; give the command to run, e.g. 'python train.py'")
        return check_command(value)

    @field_validator("runtime_env", mode="before")
    @classmethod
    def _runtime_env(cls, value: Any) -> dict[str, Any]:
        """Ray's keys only (a typo would be taken by Ray as a plugin and ignored); env_vars
        checked as `env` is. Ray's own RuntimeEnv checks the rest at submit (spec.resolve)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError("must be a mapping, e.g. {pip: [requests], env_vars: {A: '1'}}")
        for key in value:
            if key not in RUNTIME_ENV_KEYS:
                close = difflib.get_close_matches(str(key), RUNTIME_ENV_KEYS, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ValueError(f"unknown key {key!r}; {hint}Ray's keys: {', '.join(RUNTIME_ENV_KEYS)}")
        if "env_vars" in value:
            value = {**value, "env_vars": validate_env(value["env_vars"], reserved=("RAYSTACK_",))}
        return value

    @field_validator("entrypoint_memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int:
        if isinstance(value, str) and not value.strip().isdigit():
            return size_to_mb(value) * 2**20
        return value  # type: ignore[no-any-return,unused-ignore]

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata(cls, value: Any) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ValueError('must be a mapping of names to text, e.g. {"team": "rl"}')
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}

    @field_validator("sweep", mode="before")
    @classmethod
    def _sweep(cls, value: Any) -> dict[str, list[Any]]:
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(v, list) and v for v in value.values()):
            raise ValueError("must map spec keys to lists of values, e.g. {env.LR: [1e-6, 3e-6]}")
        for key in value:
            try:
                apply_sets({}, [f"{key}=0"], given_as=repr(key))  # (a key that is no field: named now)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        if math.prod(len(v) for v in value.values()) > MAX_SWEEP:
            raise ValueError(f"more than {MAX_SWEEP} combinations; split the sweep")
        return value

    @field_validator("excludes", mode="before")
    @classmethod
    def _one_pattern(cls, value: Any) -> Any:
        """`excludes: '*.ckpt'`: one pattern is a list of one."""
        return [value] if isinstance(value, str) else value

    @field_validator("launcher_args", mode="before")
    @classmethod
    def _args_line(cls, value: Any) -> Any:
        """`launcher_args: --max-restarts 2`: a line of arguments, split as the shell splits it."""
        if not isinstance(value, str):
            return value
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"{value!r}: {exc} (quote it as a shell would)") from None

    @field_validator("after", mode="before")
    @classmethod
    def _after(cls, value: Any) -> list[str]:
        if value is None:
            return []
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ValueError("give a list of job or sweep ids, e.g. [train-3fa2c1d4:ok]")
        for item in items:
            if not isinstance(item, str) or not AFTER.fullmatch(item):
                raise ValueError(f"{item!r}: give a job or sweep id, optionally with :ok, :any or :notok")
        return list(items)

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets(cls, value: Any) -> list[str]:
        if value is None:
            return []
        items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ValueError("give a list of environment variable names, e.g. [WANDB_API_KEY, HF_TOKEN]")
        for item in items:
            if not isinstance(item, str) or not ENV_NAME.fullmatch(item):
                raise ValueError(
                    f"{item!r} is not an environment variable name (letters, digits, '_'), e.g. HF_TOKEN"
                )
        return list(dict.fromkeys(items))

    @model_validator(mode="after")
    def _one_working_dir(self) -> JobSpec:
        if self.working_dir is not None and self.runtime_env.get("working_dir") is not None:
            raise ValueError("working_dir is given twice (the spec's and runtime_env's): keep one")
        both = set(self.env) & set(self.runtime_env.get("env_vars", {}))
        for key in sorted(both):
            if self.env[key] != self.runtime_env["env_vars"][key]:
                raise ValueError(
                    f"{key} is set twice, differently: in env and runtime_env.env_vars; keep one"
                )
        return self

    @model_validator(mode="after")
    def _kind(self) -> JobSpec:
        if self.kind == "ray":
            if self.launcher or self.command:
                raise ValueError("launcher and command are for kind: spmd; add kind: spmd or use entrypoint")
            return self
        if self.entrypoint:
            raise ValueError("kind: spmd makes its own entrypoint: give launcher and command instead")
        if not self.launcher or not (self.command or "").strip():
            raise ValueError("kind: spmd needs launcher (torchrun, deepspeed, accelerate) and command")
        if problem := misuse(self.launcher, str(self.command), self.launcher_args):
            raise ValueError(problem)
        self.entrypoint = check_command(spmd_entrypoint(self))
        return self

    @model_validator(mode="after")
    def _placeholders_need_a_plan(self) -> JobSpec:
        if self.plan is None and PLACEHOLDER.search(self.command or self.entrypoint):
            field = "command" if self.command else "entrypoint"
            raise ValueError(f"{field} uses {{plan.*}} but the spec has no 'plan:'; add one")
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> dict[str, str]:
        return validate_env(value, reserved=("RAYSTACK_",))

    @field_validator("timeout", "min_time", mode="before")
    @classmethod
    def _off_is_none(cls, value: Any) -> float | None:
        """A duration; 0/off/none/never: none (no timeout, no minimum)."""
        return off_or_duration(value)

    @field_validator("hang_timeout", "retry_window", "infeasible_grace", mode="before")
    @classmethod
    def _off_is_zero(cls, value: Any) -> float | None:
        """A duration, or 0/off/none/never kept as 0: off, overriding the profile's (unset: None)."""
        if value is None:
            return None
        return parse_duration(value, off=True)

    @field_validator("stop_grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float:
        return parse_duration(value, limit=86400, least=1)

    @field_validator("kind", "launcher", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value  # (SPMD, TorchRun)

    @field_validator("outputs", mode="before")
    @classmethod
    def _outputs_mapping(cls, value: Any) -> Any:
        if isinstance(value, list | str):
            raise ValueError("must map names to folders, e.g. outputs: {ckpt: checkpoints/}")
        return value

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, value: dict[str, str]) -> dict[str, str]:
        seen: dict[str, str] = {}
        for key in value:
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"{key!r} must be usable in RAYSTACK_OUTPUT_<NAME>: letters, digits, '_'")
            if key.upper() in seen:
                both = f"{seen[key.upper()]!r} and {key!r}"
                raise ValueError(f"{both} would both be RAYSTACK_OUTPUT_{key.upper()}; rename one")
            seen[key.upper()] = key
        return value


# ---------------------------------------------------------------------------- overrides
def parse_set(item: str, given_as: str | None = None) -> tuple[list[str], Any]:
    """'needs.gpus=8' -> (['needs', 'gpus'], 8): the value is read as YAML (so 8 is an int),
    except under env and resume.env, where it is kept as written (env.LR=1e-6 is "1e-6").
    `given_as`: how an error names what was given (default: --set 'ITEM')."""
    given_as = given_as or f"--set {quote(item)}"
    key, sep, raw = item.partition("=")
    path = key.split(".")
    if not sep or not key or any(not part for part in path):
        raise ConfigError(f"{given_as}: use --set key.sub=value, e.g. --set env.LR=1e-6")
    if tuple(path[:-1]) in RAW_TEXT_PATHS or raw == "":
        return path, raw
    value = parse_yaml(raw, given_as, invalid_as_text=True)
    if value is None and raw.strip() not in ("null", "Null", "NULL", "~"):  # (YAML reads `!` as an empty tag)
        return path, raw
    return path, value


def apply_sets(data: dict[str, Any], items: list[str], given_as: str | None = None) -> dict[str, Any]:
    """Apply --set overrides to raw spec data. Unknown paths list the valid keys at that level.
    `given_as`: how an error names what was given (default: --set 'ITEM'; --sweep's and the spec's
    sweep block name theirs)."""
    for item in items:
        given_as_here = given_as or f"--set {quote(item)}"
        path, value = parse_set(item, given_as_here)
        node: dict[str, Any] = data
        model_fields: dict[str, Any] | None = dict(JobSpec.model_fields)
        for i, part in enumerate(path):
            last = i == len(path) - 1
            if model_fields is not None and part not in model_fields:
                parent = ".".join(path[:i]) or "the spec"
                valid = ", ".join(sorted(model_fields))
                close = difflib.get_close_matches(part, model_fields, n=1, cutoff=0.75)
                moved = alias(part, ELSEWHERE, close) if i == 0 else None
                hint = f"did you mean {close[0]}?" if close else None
                if not hint and i == 0 and part.isidentifier():
                    hint = f"an environment variable is env.{part}"
                raise ConfigError(
                    f"{given_as_here}: {quote(part)} is not a field of {parent}"
                    + (f" ({moved})" if moved else "")
                    + f"; valid: {valid}"
                    + (f"; {hint}" if hint and not moved else "")
                )
            if last:
                node[part] = value
                break
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{given_as_here}: {quote('.'.join(path[: i + 1]))} is not a mapping")
            node = child
            model_fields = NESTED.get(part) if model_fields is not None else None
    return data


NESTED: dict[str, dict[str, Any]] = {
    "needs": dict(Needs.model_fields),
    "resume": dict(Resume.model_fields),
    "plan": dict(PlanSpec.model_fields),
}


def check_command(value: str) -> str:
    size = len((DRIVER_PREFIX + value).encode())
    if size >= MAX_ARG:
        raise ValueError(
            f"is {size:,} bytes; the kernel passes at most {MAX_ARG // 1024} KiB in one argument: "
            "put the command in a script in the working_dir and run that"
        )
    if "\0" in value:
        raise ValueError("holds a NUL byte; no shell can run it")
    return value


def spmd_entrypoint(spec: JobSpec) -> str:
    """The driver of an SPMD job: raystack's launcher, then the user's command as written."""
    words = ["python", "-m", "raystack.launch.spmd", f"--launcher={spec.launcher}"]
    if spec.nodes:
        words.append(f"--nodes={spec.nodes}")
    if spec.procs_per_node:
        words.append(f"--procs-per-node={spec.procs_per_node}")
    words += [f"--launcher-arg={a}" for a in spec.launcher_args]
    words.append(f"--stop-grace={max(1, spec.stop_grace - 5):g}")  # inside Ray's own grace
    return shlex.join(words) + " -- " + str(spec.command).strip()
