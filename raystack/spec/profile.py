"""Cluster profiles: a site's sbatch defaults, setup lines, environment and Ray node settings.

Built-ins ship with the package (slurm/profiles in the repository); the user's own in
~/.config/raystack/profiles are searched first. Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from raystack.adapters.allocator import allocator
from raystack.durations import Walltime, duration, off_or_duration, parse_duration
from raystack.errors import ConfigError
from raystack.spec.values import Size, SpecModel, load_yaml, one_line_error, refuse_yes_no, validate_env

# The built-in profiles ship as package data: raystack/profiles (in a clone, a link to
# slurm/profiles), so they are found in an installed wheel as well as in an editable install.
BUILTIN_PROFILES = Path(__file__).parent.parent / "profiles"
# Set by the allocation script or for each job: a profile's env must not shadow them.
RESERVED_ENV = (
    "RAYSTACK_HOME",
    "RAYSTACK_CLUSTER",
    "RAYSTACK_PROFILE",
    "RAYSTACK_PYTHON",
    "RAYSTACK_JOB_ID",
    "RAYSTACK_DEADLINE",
    "RAYSTACK_OUTPUT_",
    "RAYSTACK_CHAIN_",
)
CANARY_MODES = ("auto", "strict", "off")  # the interconnect canary (allocation/head/canary.py)


class Caps(SpecModel):
    """How a node copies Ray's logs (a profile's `ray_logs:`): every `every` seconds (0: only
    at teardown), at most `file_mb` per file and `node_mb` per node (0: no copy at all)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    every: float = Field(default=30.0, ge=0)
    """How often each node copies (a duration; 0: only at teardown)."""
    file_mb: float = Field(default=32.0, ge=0.01)
    """MB kept of one log file: its start and its newest end."""
    node_mb: float = Field(default=512.0, ge=0)
    """MB kept per node (0: no copy at all)."""

    @field_validator("every", mode="before")
    @classmethod
    def _every(cls, value: Any) -> float:
        """A duration (raystack's one reading: a bare number is minutes; 5s, 30s, 1m)."""
        if isinstance(value, str) and value.strip().lower() in ("off", "none", "never"):
            return 0.0
        return duration(value)

    @property
    def on(self) -> bool:
        return self.node_mb > 0

    @property
    def file_bytes(self) -> int:
        return int(self.file_mb * 2**20)

    @property
    def node_bytes(self) -> int:
        return int(self.node_mb * 2**20)

    def env(self) -> dict[str, str]:
        """How the node programs are told (read back by `from_env`)."""
        return {"RAYSTACK_RAY_LOGS": f"{self.every:g},{self.file_mb:g},{self.node_mb:g}"}

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Caps:
        value = env.get("RAYSTACK_RAY_LOGS")
        if not value:
            return cls()
        every, file_mb, node_mb = (float(v) for v in value.split(","))
        return cls.model_validate({"every": f"{every:g}s", "file_mb": file_mb, "node_mb": node_mb})


# Keys people bring from sbatch scripts and other tools, and where a profile takes what they mean.
ELSEWHERE = {
    **dict.fromkeys(("walltime", "time_limit", "max_time"), "raystack calls it time (sbatch --time)"),
    **dict.fromkeys(("gpus", "num_gpus", "gpus_per_task"), "raystack calls it gpus_per_node"),
    **dict.fromkeys(
        ("cpus", "cpus_per_node", "ncpus", "num_cpus"), "raystack calls it cpus_per_task (one task per node)"
    ),
    **dict.fromkeys(("memory", "mem_per_node"), "raystack calls it mem (sbatch --mem per node)"),
    **dict.fromkeys(
        ("modules", "module", "module_load", "prologue", "before"),
        "shell lines run on every node before Ray go under setup:, e.g. - module load cuda",
    ),
    **dict.fromkeys(("env_vars", "environment", "envs"), "raystack calls it env"),
    **dict.fromkeys(
        ("sbatch", "sbatch_options", "sbatch_args", "extra_args"), "raystack calls it extra_sbatch"
    ),
    **dict.fromkeys(
        ("nodes", "num_nodes", "nnodes"), "the node count is `raystack up --nodes N`, not a profile key"
    ),
    **dict.fromkeys(("project",), "raystack calls it account (sbatch --account)"),
}


class Profile(SpecModel):
    """A cluster profile: sbatch defaults, environment setup and Ray node settings of a site."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = "generic"
    """The profile's name (its file name without .yaml)."""
    description: str = ""
    """One line about the site, shown by `raystack profiles`."""
    backend: str = "slurm"
    """The scheduler that gives the allocations: `slurm` (adapters/slurm/); a site's own adapter
    registers another name (docs/development.md, "A new scheduler")."""
    partition: str | None = None
    """sbatch --partition (`up -p` overrides it)."""
    account: str | None = None
    """sbatch --account (`up -A`)."""
    qos: str | None = None
    """sbatch --qos (`up -q`)."""
    time: Walltime = Walltime("01:00:00")
    """Walltime of each allocation (`up -t`): minutes, H:M:S, D-H:M:S, or 2h, 1d."""
    gpus_per_node: int | Literal["auto"] = "auto"
    """GPUs per node; `auto`: every GPU the partition's nodes have (sinfo), a whole node."""
    gpu_type: str | None = None
    """A GPU type for sbatch: `volta` gives --gpus-per-node=volta:N."""
    cpus_per_task: int | Literal["auto"] | None = "auto"
    """CPUs per node (one task per node); `auto`: every CPU of the node; null: SLURM's default."""
    mem: str | None = None
    """sbatch --mem per node, e.g. 200G; "0" is all of it (the default with `auto` counts)."""
    constraint: str | None = None
    """sbatch --constraint, e.g. "a100|h100"."""
    reservation: str | None = None
    """sbatch --reservation."""
    gres: str | None = None
    """sbatch --gres beyond the GPUs, e.g. nvme:1."""
    exclusive: bool = False
    """sbatch --exclusive: no other job on the nodes."""
    extra_sbatch: list[str] = Field(default_factory=list)
    """Any other sbatch option, as --name=value (raystack's own options are refused here)."""
    setup: list[str] = Field(default_factory=list)
    """Shell lines run on every node before Ray starts: `module load ...`, `source venv/bin/activate`
    (a list, or one string of lines)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of Ray and of every job (NCCL settings, caches); RAYSTACK_* names are refused."""
    local_scratch: str = "/tmp"
    """Node-local folder for Ray's temp dir (Unix socket paths: keep it short)."""
    object_store_memory: Size | None = None
    """Ray's object store per node, e.g. 20G; default min(30% of RAM, half of /dev/shm)."""
    join_timeout: float = 300.0
    """How long a node may take to join the head before the start fails (a duration, >= 5s)."""
    join_window: int = Field(default=16, ge=0, le=4096)
    """Workers that start Ray at once (0: all at once); the rest wait for a turn, so a large start
    never swamps the head's GCS or the shared filesystem."""
    metrics: bool = False
    """Ray's metrics (a Prometheus exporter on every node); its port listens on every interface without
    auth, so it is off by default."""
    prometheus: str | None = None
    """With metrics on: the Prometheus binary the head runs on 127.0.0.1 for the dashboard (default:
    `prometheus` on PATH, when found)."""
    grafana_host: str | None = None
    """With metrics on: a site's Grafana as the head reaches it (RAY_GRAFANA_HOST)."""
    grafana_iframe_host: str | None = None
    """A site's Grafana as the browser reaches it (RAY_GRAFANA_IFRAME_HOST)."""
    idle_timeout: float | None = None
    """Go down after this long with an empty queue, no job running and no driver attached (`up --idle-
    timeout`; 0/off: never)."""
    max_nodes: int | None = Field(default=None, ge=1)
    """Grow the cluster up to this many nodes when queued jobs need them: further allocations of the
    profile's node shape, released when idle for idle_timeout (5m without one) (`up --max-nodes`)."""
    tls: bool = False
    """Mutual TLS between Ray's processes (a CA per cluster, a certificate per node) and HTTPS in front
    of the dashboard (`up --tls`)."""
    ray_logs: Caps = Field(default_factory=Caps)
    """Ray's own logs copied into logs/ray/<host>/ while the node runs, capped per file and node;
    `false` copies nothing."""
    chain: int = Field(default=1, ge=1, le=1000)
    """Allocations in a chain (`up --chain`): the cluster and its queue live across this many walltimes."""
    signal_lead: float = 600.0
    """How long before each walltime end SLURM warns, so jobs can checkpoint (`up --signal-lead`)."""
    infeasible_grace: float = 60.0
    """A job whose actor, task or placement group fits no node for this long is stopped, FAILED naming
    the demand (0/off: never)."""
    canary: Literal["auto", "off", "strict"] = "auto"
    """The interconnect canary at READY: an NCCL all-reduce over every GPU, its bus bandwidth and the
    transport NCCL chose within and between nodes (auto: on GPU clusters; strict: the cluster fails
    when NCCL misses `fabric`; off; `up --canary`, `--no-canary`)."""
    fabric: Literal["ib", "ofi", "socket"] | None = None
    """The fabric NCCL should use between nodes (ib: InfiniBand; ofi: libfabric, e.g. Slingshot's cxi):
    the canary warns, or with `canary: strict` refuses, when NCCL used anything else."""
    hang_timeout: float | None = None
    """A job with no progress for this long (no output, nothing of it moving, however busy its CPUs
    and GPUs) is suspected hung and its stacks dumped (0/off: never; a spec may set its own)."""
    hang_action: Literal["stop", "warn"] = "stop"
    """What a suspected hang does to a job that does not say: stop it (FAILED `hung: ...`) or warn
    (it runs on, its message says since when)."""
    folder_cap: Size | None = Size("8G")
    """The cluster folder's total size: the oldest allocations' copies of Ray's logs, usage samples and
    worker logs are pruned beyond it (0/off: never)."""
    job_log_cap: Size = Size("1G")
    """Each attempt's driver log: beyond it, its start and its end are kept."""

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        from raystack.adapters.allocator import plugins

        if value not in (known := plugins()):
            raise ValueError(
                f"no scheduler {value!r} here; one of {', '.join(known)} (`up --local` for this machine)"
            )
        return value

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_lines(cls, value: Any) -> Any:
        """One line (`setup: module load cuda`) or a block of them (`setup: |`) is a list of one
        line each, as a person writing a shell script means it."""
        return [ln for ln in value.splitlines() if ln.strip()] if isinstance(value, str) else value

    @field_validator("signal_lead", mode="before")
    @classmethod
    def _lead(cls, value: Any) -> float:
        return parse_duration(value, limit=65535, least=1)  # SLURM's --signal: 1 to 65535 s

    @field_validator("join_timeout", mode="before")
    @classmethod
    def _join(cls, value: Any) -> float:
        return parse_duration(value, least=5)

    @field_validator("ray_logs", mode="before")
    @classmethod
    def _ray_logs(cls, value: Any) -> Any:
        if value is False:
            return {"node_mb": 0}
        return {} if value is True or value is None else value

    @field_validator("idle_timeout", "hang_timeout", mode="before")
    @classmethod
    def _idle(cls, value: Any) -> float | None:
        return idle_timeout(value)

    @field_validator("infeasible_grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float:
        return parse_duration(value, limit=86400, off=True)  # (0, off: never stopped for it)

    @field_validator("folder_cap", mode="before")
    @classmethod
    def _folder_cap(cls, value: Any) -> Any:
        if value is None or value is False or str(value).strip().lower() in ("0", "off", "none"):
            return None
        return value

    @field_validator("job_log_cap")
    @classmethod
    def _job_log_cap(cls, value: Size) -> Size:
        if value.bytes < 2**20:
            raise ValueError(f"{str(value)!r} is too small; use at least 1MB, e.g. 1G")
        return value

    def node_env(self) -> dict[str, str]:
        """How the profile reaches the node programs and the queue runner (allocation/node/context.py
        reads it back): exported by the launch script, before the profile's own env."""
        folder_cap = self.folder_cap.bytes if self.folder_cap else 0
        optional = {
            "RAYSTACK_HANG_TIMEOUT": f"{self.hang_timeout:g}" if self.hang_timeout else None,
            "RAYSTACK_HANG_ACTION": self.hang_action if self.hang_action != "stop" else None,
            "RAYSTACK_CANARY": self.canary if self.canary != "auto" else None,
            "RAYSTACK_FABRIC": self.fabric,
            "RAYSTACK_OBJECT_STORE_MEMORY": self.object_store_memory,
            "RAYSTACK_METRICS": "1" if self.metrics else None,
            "RAYSTACK_TLS": "1" if self.tls else None,
            "RAYSTACK_IDLE_TIMEOUT": f"{self.idle_timeout:g}" if self.idle_timeout else None,
            "RAYSTACK_PROMETHEUS": self.prometheus,
            "RAY_GRAFANA_HOST": self.grafana_host,
            "RAY_GRAFANA_IFRAME_HOST": self.grafana_iframe_host,
        }
        return {
            "RAYSTACK_LOCAL_SCRATCH": self.local_scratch,
            "RAYSTACK_JOIN_TIMEOUT": f"{self.join_timeout:g}",
            "RAYSTACK_JOIN_WINDOW": str(self.join_window),
            **self.ray_logs.env(),
            "RAYSTACK_INFEASIBLE_GRACE": f"{self.infeasible_grace:g}",
            "RAYSTACK_FOLDER_CAP": str(folder_cap),
            "RAYSTACK_JOB_LOG_CAP": str(self.job_log_cap.bytes),
            **{key: value for key, value in optional.items() if value},
        }

    @model_validator(mode="after")
    def _metrics_needed(self) -> Profile:
        for key in ("prometheus", "grafana_host"):
            if getattr(self, key) and not self.metrics:
                raise ValueError(f"{key} needs `metrics: true` (Ray exports no metrics otherwise)")
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> dict[str, str]:
        return validate_env(value, reserved=RESERVED_ENV, expands=False)

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """In the words of the profile's backend (`backend` is read before it)."""
        backend = allocator(str(info.data.get("backend") or "slurm"))
        try:
            return [backend.check_native(str(option), "", profile=True) for option in value]
        except ConfigError as exc:
            raise ValueError(str(exc).strip()) from None

    @field_validator("gpus_per_node", "cpus_per_task", mode="before")
    @classmethod
    def _counts(cls, value: Any) -> int | str | None:
        if value is None or value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 4096:
            raise ValueError(f"{value!r} is not a count per node: use a number from 0 to 4096, or auto")
        return value


def idle_timeout(value: Any) -> float | None:
    """An idle timeout from a profile or `--idle-timeout`: a duration, or off/none/0 for never."""
    return off_or_duration(value)


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, the user's first: ~/.config/raystack/profiles, built-ins."""
    dirs = [Path(p) for p in os.environ.get("RAYSTACK_PROFILE_PATH", "").split(os.pathsep) if p]
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return [*dirs, config_home / "raystack" / "profiles", BUILTIN_PROFILES]


def available_profiles() -> list[str]:
    names = {p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def profile_path(name: str) -> Path | None:
    """The file a profile name (or a path to a .yaml file) stands for, if there is one."""
    if name.lower().endswith((".yaml", ".yml")):
        return Path(name) if Path(name).is_file() else None
    return next((d / f"{name}.yaml" for d in profile_dirs() if (d / f"{name}.yaml").is_file()), None)


def load_profile(name: str = "generic") -> Profile:
    """Load a profile by name (or path to a .yaml file)."""
    path = profile_path(name)
    if path is None and name.lower().endswith((".yaml", ".yml")):
        raise ConfigError(
            f"no profile file {name} (no such file); or give a profile's name: raystack profiles"
        )
    if path is None:
        close = difflib.get_close_matches(name, available_profiles(), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(
            f"unknown profile '{name}': {hint}choose one of {', '.join(available_profiles())} "
            f"(raystack profiles), or add {profile_dirs()[-2]}/{name}.yaml"
        )
    data = load_yaml(path)
    data.setdefault("name", path.stem)
    refuse_yes_no(data, Profile, f"profile {path}")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(one_line_error(exc, f"profile {path}", Profile, ELSEWHERE)) from exc
