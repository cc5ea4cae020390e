"""A job spec from where it comes: a YAML file or a bare command after `--`, with `--set` overrides,
validated into a JobSpec with one line naming the file, the field and the fix."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from pydantic import (
    ValidationError,
)

from raystack.errors import ConfigError
from raystack.spec.job import ELSEWHERE, JobSpec, apply_sets
from raystack.spec.values import (
    load_yaml,
    one_line_error,
    refuse_yes_no,
    shell_line,
    split_or,
)


def load_spec(path: str | Path, sets: list[str] | None = None) -> JobSpec:
    """Load and validate a spec file; --set overrides are applied first. Top-level keys starting
    with `x-` are the user's (YAML anchors for `<<:` merge keys, as docker-compose files keep
    them) and are left out."""
    file = Path(path)
    data = {k: v for k, v in load_yaml(file).items() if not str(k).startswith("x-")}
    data.setdefault("name", file.stem)
    return validate(apply_sets(data, sets or []), f"job spec {file}")


def command_name(argv: list[str]) -> str:
    """A job name from a command: `python train.py` -> train, `python -m pkg.mod` -> mod."""
    word = Path(argv[0]).name
    if word.startswith("python") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            word = argv[2].rsplit(".", 1)[-1]
        elif not argv[1].startswith("-"):
            word = Path(argv[1]).stem
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", word).lstrip("-._")[:63]
    return clean or "job"


def command_spec(argv: list[str], sets: list[str] | None = None, name: str | None = None) -> JobSpec:
    """A spec for a bare command: `raystack submit -- python train.py --lr 1e-6`."""
    if not argv:
        raise ConfigError(
            "submit: give a spec file or a command after --, e.g. raystack submit -- python x.py"
        )
    line = shell_line(argv)
    words = argv if line is None else split_or(line, argv)
    data = {"name": name or command_name(words), "entrypoint": line or shlex.join(argv)}
    data = apply_sets(data, sets or [])
    if data.get("kind") == "spmd" or data.get("launcher"):  # `raystack submit --launcher torchrun -- x.py`
        command = data.pop("entrypoint")
        data = {**data, "kind": "spmd", "command": command}
    return validate(data, "command")


def validate(data: dict[str, Any], source: str) -> JobSpec:
    typo = not set(data) <= set(JobSpec.model_fields)  # an unknown key explains a missing one better
    if data.get("kind", "ray") == "ray" and "entrypoint" not in data and not typo:
        if "command" in data or "launcher" in data:  # an SPMD job without its kind
            raise ConfigError(
                f"{source}: command and launcher are for kind: spmd; add kind: spmd (with launcher: "
                "torchrun, deepspeed or accelerate), or write the Ray driver as entrypoint: ..."
            )
        raise ConfigError(f"{source}: missing field 'entrypoint'; add it, e.g. entrypoint: python train.py")
    refuse_yes_no(data, JobSpec, source)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        unknown = any(e["type"] == "extra_forbidden" for e in errors)  # a typo explains a "missing"
        err = errors[0]
        if err["type"] == "missing" and not unknown:
            field = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"{source}: missing field '{field}'; add it, e.g. {field}: ...") from exc
        raise ConfigError(one_line_error(exc, source, JobSpec, ELSEWHERE)) from exc
