"""Values shared by profiles and job specs: sizes, environments, and YAML loading (durations and
SLURM times are raystack.durations's, re-exported here). Every problem becomes one ConfigError
line naming the file, the field and the fix.
"""

from __future__ import annotations

import difflib
import logging
import re
import shlex
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from raystack.durations import (  # noqa: F401 (the durations, read where values are)
    MAX_DURATION,
    OFF,
    ParsedText,
    duration_text,
    off_or_duration,
    parse_duration,
    time_to_seconds,
    validate_time,
)
from raystack.errors import ConfigError

log = logging.getLogger("raystack")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?", re.IGNORECASE)


def env_value(key: str, value: Any) -> str:
    """An environment value as text: numbers as written, booleans as true/false, null as ''."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, str | int | float):
        return str(value)
    kind = (
        "list" if isinstance(value, list) else "mapping" if isinstance(value, dict) else type(value).__name__
    )
    raise ValueError(f"{key} is a {kind}; environment values are strings, numbers or booleans")


def validate_env(value: Any, reserved: tuple[str, ...] = (), expands: bool = True) -> dict[str, str]:
    """Environment of a profile or job spec: valid names, scalar values (kept as text), and no
    variable that SLURM, Ray or raystack set (`reserved`: names or prefixes ending in '_').
    `expands`: whether $VAR in a value is expanded where it is set (a job's env: Ray does; a
    profile's env is exported as written, so PATH there belongs in a setup line)."""
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of variable names to values, e.g. {LR: 1e-6}")
    env = {}
    for key, raw in value.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if key == "CUDA_VISIBLE_DEVICES" or key.startswith("RAY_EXPERIMENTAL_NOSET_"):
            raise ValueError(f"never set {key}: SLURM and Ray assign GPUs to each actor")
        if any(key == r or (r.endswith("_") and key.startswith(r)) for r in reserved):
            raise ValueError(f"{key} is set by raystack itself; choose another name")
        if key.startswith("SLURM_") and expands:  # (a profile may set srun's input variables)
            raise ValueError(f"{key} is set by SLURM for the allocation; choose another name")
        if key in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_ID"):
            raise ValueError(f"{key} is set by Ray for every job (it is how ray.init() finds the cluster)")
        text = env_value(key, raw)
        if key == "PATH" and not expands:
            raise ValueError(
                "PATH here is exported as written: extend it in a setup line instead, e.g. "
                "setup: ['export PATH=/opt/tool/bin:$PATH']"
            )
        if key == "PATH" and "$PATH" not in text and "${PATH}" not in text:
            raise ValueError(
                "PATH would replace the nodes' search path (python, your venv): extend it, e.g. "
                "PATH: /opt/tool/bin:$PATH (Ray expands $PATH on the node)"
            )
        if "\0" in text:
            raise ValueError(f"{key} holds a NUL byte, which no environment can carry")
        env[key] = text
    return env


def size_to_mb(value: str | int) -> int:
    """'2GB', '512M', '1.5GiB' or a number of MB -> MB."""
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a size; use e.g. 512MB or 2GB")
    number, unit = float(match.group(1)), (match.group(2) or "M")[0].upper()
    return int(number * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit])


class Size(ParsedText):
    """A size read once where it is loaded: the text as written ('8G') with its `.bytes`."""

    bytes: int

    def __new__(cls, value: str | int) -> Size:
        mb = size_to_mb(value)
        self = super().__new__(cls, str(value).strip())
        self.bytes = mb * 2**20
        return self


def keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys valid where an unknown key `loc` was found: the fields of the (nested) model that
    holds it, e.g. ray_logs.evry -> every, file_mb, node_mb."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        inner = (field.annotation, *typing.get_args(field.annotation)) if field else ()
        nested = next((t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if nested is None:
            break
        model = nested
    return sorted(model.model_fields)


class SpecModel(BaseModel):
    """A model read from a YAML file a person wrote (job spec, profile, plan): its loader checks
    the data with `refuse_yes_no` first."""


def refuse_yes_no(data: Any, model: type[BaseModel], source: str, at: str = "") -> None:
    """YAML reads yes, no, on and off as true/false, and pydantic would take true as the number 1:
    where `model` means a number (retries: yes, needs.gpus: on), refuse it, naming the field. One
    walk of the data as loaded, nested models included; a field with a validator of its own (a
    duration: `off` is false there) says what it takes itself."""
    if not isinstance(data, dict):
        return
    own = {f for d in model.__pydantic_decorators__.field_validators.values() for f in d.info.fields}
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None or key in own:
            continue
        if isinstance(value, bool) and _numeric(field.annotation):
            raise ConfigError(
                f"{source}: field '{printable(at + key)}': {str(value).lower()} is a yes/no "
                "(YAML reads yes, no, on, off so), not a number"
            )
        for kind in typing.get_args(field.annotation) or (field.annotation,):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                refuse_yes_no(value, kind, source, f"{at}{key}.")


def _numeric(annotation: Any) -> bool:
    kinds = {t for t in (typing.get_args(annotation) or (annotation,)) if t is not type(None)}
    return bool(kinds) and kinds <= {int, float}


def one_line_error(
    exc: ValidationError, source: str, model: type[BaseModel], elsewhere: Mapping[str, str] | None = None
) -> str:
    """The most useful of pydantic's errors as one line: an unknown key (a typo) comes first,
    with the keys valid at its place in `model`. `elsewhere`: top-level keys people bring from
    other tools (`resources`, `env_vars`, `walltime`) and where raystack takes what they mean."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    field = printable(".".join(str(p) for p in err["loc"])) or "(top level)"
    if err["type"] == "extra_forbidden":
        valid = keys_at(model, err["loc"])
        key = str(err["loc"][-1])
        close = difflib.get_close_matches(key, valid, n=1)
        moved = alias(key, elsewhere or {}, close) if len(err["loc"]) == 1 else None
        hint = f" ({moved})" if moved else f" (did you mean '{close[0]}'?)" if close else ""
        if not hint and len(err["loc"]) == 1 and isinstance(err.get("input"), dict) and "job spec" in source:
            hint = " (a key that holds YAML anchors for `<<:` merge keys: name it x-" + printable(key) + ")"
        return f"{source}: unknown key '{field}'{hint}; valid keys: {', '.join(valid)}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] not in ("value_error", "assertion_error") and "input" in err:
        message += f" (got {quote(err['input'])})"
    if not err["loc"]:  # a rule across fields (the model's own validator)
        return f"{source}: {message}"[:MAX_MESSAGE]
    return f"{source}: field '{field}': {message}"[:MAX_MESSAGE]


def alias(key: str, elsewhere: Mapping[str, str], close: list[str]) -> str | None:
    """Where raystack takes what a key from another tool means (`env_vars`: env), also for a typo
    of one (`enviroment`), unless the key is already close to a valid one (`close`)."""
    key = key.lower().replace("-", "_")
    if key in elsewhere:
        return elsewhere[key]
    near = [] if close else difflib.get_close_matches(key, list(elsewhere), n=1, cutoff=0.8)
    return elsewhere[near[0]] if near else None


MAX_MESSAGE = 600  # characters of one error line
MAX_QUOTE = 80  # characters of a value quoted in it


def printable(text: str) -> str:
    """Text for an error line: as it is when printable, escaped (and cut short) when not."""
    if not text.isprintable():
        text = repr(text)[1:-1]
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


def quote(value: Any) -> str:
    """A value for an error message: its repr, cut short (values can be huge)."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


# ---------------------------------------------------------------------------- YAML
MAX_FILE = 1 << 20  # bytes: a profile or job spec is a few lines
MAX_NODES = 10_000  # YAML values after expanding aliases (a "billion laughs" spec stays small on disk)
# mappings whose values are kept as written (LR: 1e-6 stays "1e-6", 010 stays "010", yes stays "yes")
RAW_TEXT_PATHS = (("env",), ("resume", "env"), ("runtime_env", "env_vars"), ("metadata",))
# Mappings whose values are lists of text as written (a sweep's values: applied as --set text).
RAW_TEXT_LISTS = (("sweep",),)


class _Loader(yaml.SafeLoader):
    """Safe YAML, stricter: duplicate keys are refused (YAML would keep the last silently; a merge
    key's `<<: *anchor` keys are defaults the mapping's own override, as YAML says), and
    `24:00:00` or `1:30` is text, as YAML 1.2 reads it: YAML 1.1 (PyYAML) makes such a time a
    base-60 number (86400), which no duration field could tell from minutes."""

    yaml_implicit_resolvers = {  # noqa: RUF012 (PyYAML reads it per class)
        first: [(tag, regexp) for tag, regexp in resolvers if not tag.endswith((":int", ":float"))]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys yield to ours
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {quote(key)}", key_node.start_mark
                )
            seen.add(key)
        self.flatten_mapping(node)
        return super().construct_mapping(node, deep)


# PyYAML's int and float patterns, less their base-60 forms.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _expanded_size(node: yaml.Node, memo: dict[int, int], depth: int = 0) -> int:
    """Nodes a document holds once every alias is expanded (computed without expanding them)."""
    if id(node) in memo:
        return memo[id(node)]
    if depth > 100:
        return MAX_NODES + 1
    memo[id(node)] = MAX_NODES + 1  # a cycle counts as too big
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(n, memo, depth + 1) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(
            _expanded_size(k, memo, depth + 1) + _expanded_size(v, memo, depth + 1) for k, v in node.value
        )
    memo[id(node)] = min(size, MAX_NODES + 1)
    return memo[id(node)]


def _raw_text_values(node: yaml.Node, path: tuple[str, ...] = ()) -> None:
    """Make the scalar values of the RAW_TEXT_PATHS mappings plain strings, as written."""
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        here = (*path, key.value)
        if here in RAW_TEXT_LISTS and isinstance(value, yaml.MappingNode):
            for _, items in value.value:
                for item in items.value if isinstance(items, yaml.SequenceNode) else []:
                    if isinstance(item, yaml.ScalarNode) and item.tag != "tag:yaml.org,2002:null":
                        item.tag = "tag:yaml.org,2002:str"
        elif here in RAW_TEXT_PATHS and isinstance(value, yaml.MappingNode):
            for _, item in value.value:
                if isinstance(item, yaml.ScalarNode):
                    if item.tag == "tag:yaml.org,2002:null":
                        item.value = ""
                    item.tag = "tag:yaml.org,2002:str"
        elif any(p[: len(here)] == here for p in RAW_TEXT_PATHS):
            _raw_text_values(value, here)


def _yaml_fix(text: str, line: int | None) -> str:
    """The fix for the YAML mistakes people make most, told from the line it stopped at."""
    lines = text.splitlines()
    here = lines[line] if line is not None and 0 <= line < len(lines) else ""
    if "\t" in here[: len(here) - len(here.lstrip())]:
        return "indent with spaces, not tabs"
    if re.match(r"\s*[-\w.]+:\s+[^\s\"'|>].*:\s", here):
        return (
            "a value holding ': ' (a command, a lambda) must be quoted, e.g. "
            "entrypoint: \"python -c 'a: b'\", or written as a block (entrypoint: |)"
        )
    return "fix it"


def parse_yaml(text: str, source: str, raw_text: bool = True, invalid_as_text: bool = False) -> Any:
    """YAML text -> data, refusing duplicate keys and alias bombs. Raises ConfigError; with
    `invalid_as_text`, text that is not YAML at all is returned as it is (for --set values)."""
    loader = None
    try:
        loader = _Loader(text)  # NOTE: reads the text at once: a ReaderError may come from here
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise ConfigError(
                f"{source}: holds more than {MAX_NODES:,} values once its YAML aliases are expanded; "
                "write it out without aliases (&name / *name)"
            )
        if raw_text:
            _raw_text_values(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        if invalid_as_text:
            return text
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        mark = getattr(exc, "problem_mark", None)
        at_line = f" at line {mark.line + 1}" if mark is not None else ""
        fix = _yaml_fix(text, mark.line if mark is not None else None)
        raise ConfigError(f"{source}: not valid YAML ({str(problem)[:120]}{at_line}): {fix}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply; flatten it") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: Path) -> dict[str, Any]:
    """A profile or job spec file as a mapping. Raises ConfigError naming the file and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    if len(raw) > MAX_FILE:
        raise ConfigError(
            f"{path}: is {len(raw) / 2**20:.1f} MiB; a spec is a few lines of YAML (at most 1 MiB)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    data = parse_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of keys to values, got {type(data).__name__}")
    return data


def shell_line(argv: list[str]) -> str | None:
    """One word after `--` that holds a space (`-- 'echo LR=$LR'`) is a shell command line, as
    `ray job submit` runs it (it joins the words with spaces); quoted as one word, a shell would
    look for a program of that whole name (exit 127). None for a command of several words."""
    if len(argv) != 1 or not any(c.isspace() for c in argv[0]):
        return None
    log.warning(
        "raystack: note: the one word after -- is run by the shell as a command line, as ray job "
        "submit runs it: %s",
        argv[0],
    )
    return argv[0]


def split_or(line: str, argv: list[str]) -> list[str]:
    try:
        return shlex.split(line) or argv
    except ValueError:
        return argv
