"""What raystack's default excludes leave out of a working_dir, told at submit and on a failure."""

from __future__ import annotations

from pathlib import Path
from zipfile import ZipFile

from raystack.spec import workdir
from raystack.spec.workdir import BULK, DEFAULT_EXCLUDES, left_out_note, missing_hint


def zipped(root: Path, excludes: list[str], out: Path) -> set[str]:
    """The files Ray 2.60's own packager puts in a working_dir package."""
    from ray._private.runtime_env.packaging import create_package

    create_package(
        str(root), out, include_gitignore=True, excludes=[*workdir.ray_default_excludes(), *excludes]
    )
    with ZipFile(out) as zf:
        return {n for n in zf.namelist() if not n.endswith("/")}


def test_what_the_defaults_leave_out_is_named_as_ray_leaves_it_out(tmp_path: Path) -> None:
    """An RL repo's env/ package, a nested wandb/ and a small *.bin are left out by the defaults
    alone: named (a folder once, not each file). What .gitignore, the spec's own excludes or the
    tooling defaults leave out is not; a `!pattern` takes one back."""
    root = tmp_path / "repo"
    for rel in [
        "train.py",
        "env/__init__.py",
        "env/grid.py",
        "pkg/wandb/run1/a.txt",
        "pkg/m.py",
        "tokenizer.bin",
        "keep.bin",
        "model.pt",  # (.gitignore)
        "outputs/o.txt",  # (the spec's own excludes)
        "__pycache__/x.pyc",  # (tooling: never worth a word)
        "environment.yaml",
    ]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text("*.pt\n")
    own = ["outputs/", "!keep.bin"]
    up = workdir.scan(root, [*DEFAULT_EXCLUDES, *own])
    assert up.left_out == {"env/": "env/", "pkg/wandb/": "wandb/", "tokenizer.bin": "*.bin"}
    # Ray's packager drops exactly those files because of BULK, and nothing else because of it.
    everything = zipped(root, [p for p in DEFAULT_EXCLUDES if p not in BULK] + own, tmp_path / "a.zip")
    uploaded = zipped(root, [*DEFAULT_EXCLUDES, *own], tmp_path / "b.zip")
    assert sorted(up.files) == sorted(uploaded)
    dropped = everything - uploaded
    named = {f for f in dropped if any(f == p or (p.endswith("/") and f.startswith(p)) for p in up.left_out)}
    assert dropped == named == {"env/__init__.py", "env/grid.py", "pkg/wandb/run1/a.txt", "tokenizer.bin"}
    # Taken back, or excluded by the spec's own word: nothing to tell.
    assert workdir.scan(root, [*DEFAULT_EXCLUDES, "!env/", "!*.bin", "wandb/", "outputs/"]).left_out == {}
    # A list that is not a resolved job's (no defaults first) names nothing.
    assert workdir.scan(root, ["env/"]).left_out == {}


def test_the_note_names_what_was_left_out_and_the_fix() -> None:
    note = left_out_note({"env/": "env/", "data/tok.bin": "*.bin"})
    assert note.startswith("not uploaded (raystack's default excludes): data/tok.bin (*.bin), env/;"), note
    fix = "; a job that needs one: add '!*.bin' to its excludes (excludes: [\"!*.bin\"])"
    assert note.endswith(fix), note
    many = {f"w{i}.bin": "*.bin" for i in range(7)}
    assert "w3.bin (*.bin) and 3 more;" in left_out_note(many)
    full = {f"w{i:02d}.bin": "*.bin" for i in range(workdir.MAX_LEFT_OUT)}
    assert " and more;" in left_out_note(full)


def test_a_failure_on_a_missing_module_or_file_names_what_the_defaults_left_out() -> None:
    left = {"env/": "env/", "tokenizer.bin": "*.bin", "pkg/wandb/": "wandb/"}
    hint = missing_hint("ModuleNotFoundError: No module named 'env.grid'", left)
    assert hint == (
        " (env/ was not uploaded: raystack's default excludes leave out env/; add '!env/' to its excludes)"
    )
    path = "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/r/_ray_pkg_1/tokenizer.bin'"
    assert "tokenizer.bin was not uploaded" in missing_hint(path, left)
    assert "pkg/wandb/ was not uploaded" in missing_hint("No such file or directory: 'pkg/wandb/x'", left)
    # The job's own errors get no hint: another error, or a name that only starts alike.
    assert missing_hint("KeyError: 'env'", left) == ""
    assert missing_hint("FileNotFoundError: 'environment.yaml'", left) == ""
    assert missing_hint("ModuleNotFoundError: No module named 'env'", {}) == ""
