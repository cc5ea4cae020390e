"""The example jobs shipped with the package: jobs/debug of the repository, linked into it as
raystack/examples (a wheel carries them as package data), copied out by `raystack examples DIR`."""

from __future__ import annotations

import shutil
from pathlib import Path

from raystack.errors import ConfigError

FOLDER = Path(__file__).resolve().parents[1] / "examples"
KINDS = (".yaml", ".py", ".json")


def example_files() -> list[Path]:
    """The shipped examples: specs and the scripts and configs they run."""
    return sorted(p for p in FOLDER.iterdir() if p.suffix in KINDS) if FOLDER.is_dir() else []


def copy_examples(folder: Path, force: bool = False) -> list[Path]:
    """Copy every example into `folder` (made if missing); refuse, before copying anything, to
    overwrite a file there unless `force`. The copies made."""
    files = example_files()
    if not files:
        raise ConfigError(f"no examples in {FOLDER}: this installation of raystack lacks its package data")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder: give a folder to copy the examples into")
    clash = [f.name for f in files if (folder / f.name).exists()]
    if clash and not force:
        raise ConfigError(f"{folder} already holds {', '.join(clash[:3])}: give another folder, or --force")
    folder.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(f, folder / f.name)) for f in files]
