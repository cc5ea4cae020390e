"""Extra sbatch options (`up --sbatch`, a profile's `extra_sbatch`): what a user may add, and
what raystack owns and refuses, naming the flag to use instead.

sbatch reads its options with getopt_long: a long option may be cut to any unique prefix
(`--par=gpu` is --partition) and a short one takes its value glued or apart (`-pgpu`, `-p gpu`).
The allocation's argv reaches sbatch without a shell, so `-p gpu` as one element would hand it
" gpu": every option is rewritten to `--long=value` where the letter is known.
"""

from __future__ import annotations

from raystack.errors import ConfigError

# sbatch's short letters that take a value, and the long option each stands for.
SHORT = {
    "A": "account",
    "a": "array",
    "b": "begin",
    "C": "constraint",
    "c": "cpus-per-task",
    "D": "chdir",
    "d": "dependency",
    "e": "error",
    "G": "gpus",
    "i": "input",
    "J": "job-name",
    "L": "licenses",
    "M": "clusters",
    "m": "distribution",
    "N": "nodes",
    "n": "ntasks",
    "o": "output",
    "p": "partition",
    "q": "qos",
    "S": "core-spec",
    "t": "time",
    "w": "nodelist",
    "x": "exclude",
}
# Short letters that are switches (no value).
SWITCHES = {
    "H": "hold",
    "h": "help",
    "k": "no-kill",
    "O": "overcommit",
    "Q": "quiet",
    "s": "oversubscribe",
    "W": "wait",
    "V": "version",
    "v": "verbose",
}

# What raystack sets itself, and what to use instead.
OWNED = {
    "nodes": "use -N/--nodes",
    "time": "use -t/--time",
    "job-name": "use -J/--name (the cluster's name)",
    "partition": "use -p/--partition",
    "account": "use -A/--account",
    "qos": "use -q/--qos",
    "mem": "use --mem",
    "exclusive": "use --exclusive",
    "constraint": "use -C/--constraint",
    "reservation": "use --reservation",
    "gres": "use --gres",
    "gpus-per-node": "use --gpus-per-node (e.g. 4 or volta:4)",
    "gpus": "use --gpus-per-node (raystack asks GPUs per node)",
    "cpus-per-task": "use -c/--cpus-per-task",
    "ntasks": "raystack runs one node program per node (--ntasks-per-node=1)",
    "ntasks-per-node": "raystack runs one node program per node (--ntasks-per-node=1)",
    "array": "one allocation is one cluster: use --chain K for K allocations in a row, or several clusters",
    "signal": "use --signal-lead (raystack asks B:USR1 for its batch shell; a signal without B: kills Ray)",
    "output": "raystack writes the allocation's log into the cluster folder (logs/)",
    "error": "raystack writes the allocation's log into the cluster folder (logs/)",
    "parsable": "raystack passes it itself",
    "wait": "raystack up waits itself (add --no-wait to return at once)",
    "wrap": "raystack submits its own allocation script",
    "help": "see `sbatch --help`",
    "version": "see `sbatch --version`",
}
KNOWN = set(SHORT.values()) | set(SWITCHES.values()) | set(OWNED)


def split(option: str) -> tuple[str, str | None]:
    """(long name, value or None) of one option as written: --name[=value], -Xvalue, -X value."""
    text = option.strip()
    if text.startswith("--"):
        name, eq, value = text[2:].partition("=")
        if not eq and " " in name:
            name, _, value = name.partition(" ")
            return name, value.strip()
        return name, value if eq else None
    if text.startswith("-") and len(text) >= 2:
        letter, rest = text[1], text[2:].strip()
        if letter in SWITCHES and not rest:
            return SWITCHES[letter], None
        if letter in SHORT:
            return SHORT[letter], rest.removeprefix("=") if rest else None
        raise ConfigError(f"--sbatch {option!r}: sbatch has no option -{letter}; see `sbatch --help`")
    raise ConfigError(
        f"--sbatch {option!r} is not an sbatch option; write it as --name=value, e.g. --sbatch=--exclusive"
    )


def owned(name: str) -> str | None:
    """Which option raystack owns that `name` means (sbatch takes unique prefixes), or None."""
    if name in OWNED:
        return name
    if name in KNOWN or len(name) < 2:
        return None
    hits = sorted(
        (o for o in OWNED if o.startswith(name)), key=lambda o: (not OWNED[o].startswith("use "), o)
    )
    return hits[0] if hits else None  # (an ambiguous prefix is an sbatch error anyway)


# The owned options a profile sets with keys of its own.
PROFILE_KEYS = {
    "partition": "partition: NAME",
    "account": "account: NAME",
    "qos": "qos: NAME",
    "mem": "mem: SIZE",
    "exclusive": "exclusive: true",
    "constraint": "constraint: LIST",
    "reservation": "reservation: NAME",
    "gres": "gres: LIST",
    "gpus-per-node": "gpus_per_node: N (and gpu_type: TYPE)",
    "cpus-per-task": "cpus_per_task: N",
    "time": "time: TIME",
}


def check(option: str, source: str = "--sbatch", profile: bool = False) -> str:
    """One extra sbatch option, as sbatch will be given it (`--name=value` or `--name`).
    ConfigError naming raystack's own flag (or, for a profile, its key) when raystack sets that
    option itself."""
    name, value = split(option)
    if not name or not all(c.isalnum() or c == "-" for c in name):
        raise ConfigError(f"{source} {option!r} is not an sbatch option; write it as --name=value")
    mine = owned(name)
    if mine is not None and profile and mine in PROFILE_KEYS:
        raise ConfigError(f"{source} {option!r}: the profile has a key for it: {PROFILE_KEYS[mine]}")
    if mine is not None:
        fix = OWNED[mine]
        if fix.startswith("use "):
            raise ConfigError(f"{source} {option!r}: --{mine} is raystack up's own option; {fix}")
        raise ConfigError(f"{source} {option!r}: raystack sets --{mine} itself; {fix}")
    return f"--{name}" if value is None else f"--{name}={value}"
