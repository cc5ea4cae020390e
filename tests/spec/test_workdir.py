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


# Lines a .gitignore may hold, odd ones included; each against the files below (as a walk meets them).
ODD = [
    "!", "foo\\", "\\", "\\#hash", "#comment", "\\!bang", "**/deep", "a/**/b", "dir/", "/root.txt",
    "*.log", "!keep.log", "[abc].txt", "[!x].md", " lead", "trail ", "**", "a/*", "[", "x/**",
    "!/", "/", "*.tmp\\", "a\\b", "**/", "!!double", "c[", "\\[lit", "*/", "?", "???.cfg",
]  # fmt: skip
FILES = [
    "!", "foo", "#hash", "bang", "!bang", "x/deep", "deep", "a/b", "a/c/b", "dir/f", "dirf", "root.txt",
    "sub/root.txt", "z.log", "keep.log", "a.txt", "d.txt", "y.md", "x.md", " lead", "trail", "x/y/z",
    "c[", "[lit", "ab", "t.tmp", "abc.cfg", "q", "!!double", "e/f/g",
]  # fmt: skip
# (Where the public pathspec and git part, left out: an escaped trailing space, `sp\ `, which
# git reads as `sp ` and pathspec 1.1 refuses: skipped with a warning.)


def test_the_matcher_takes_what_git_takes_and_skips_what_git_skips(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Each odd line alone in a .gitignore: the files the walk leaves out are those `git
    check-ignore` ignores; a line git does not read as a pattern is skipped with a warning naming
    the file and line, and nothing raises."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        import pytest

        pytest.skip("git is not installed")
    root = tmp_path / "wd"
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for line in ODD:
        (root / ".gitignore").write_text(line + "\n")
        out = subprocess.run(
            ["git", "-c", "core.quotepath=off", "check-ignore", "--no-index", "-z", "--stdin"],
            cwd=root, input="\0".join(FILES), capture_output=True, text=True,
        )  # fmt: skip
        ignored_by_git = set(out.stdout.split("\0")) - {""}
        caplog.clear()
        uploaded = set(workdir.scan(root, []).files) - {".gitignore"}
        left_out = {f for f in FILES if f not in uploaded}
        assert left_out == ignored_by_git, (line, sorted(left_out ^ ignored_by_git))
        warned = [r.getMessage() for r in caplog.records if "is not a pattern git uses" in r.getMessage()]
        if line in ("!", "foo\\", "\\", "*.tmp\\"):
            assert warned and f"{root / '.gitignore'} line 1" in warned[0], (line, warned)


def test_a_working_dir_ray_cannot_package_goes_to_ray_as_a_zip_ray_takes(tmp_path: Path) -> None:
    """Ray 2.60's packager fails (IndexError) on a `!` line of a .gitignore or the excludes:
    `packed` zips what the walk found, the same zip for the same content, and Ray's own upload
    path takes a zip as it is."""
    root = tmp_path / "wd"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print('ok')\n")
    (root / "data" / "big.bin").write_text("x" * 1000)
    (root / "run.log").write_text("log")
    assert workdir.packed(root, [], tmp_path) is None  # (nothing odd: Ray packages it itself)
    (root / ".gitignore").write_text("data/\n!\n*.log\n")
    from ray._private.runtime_env.packaging import create_package, get_uri_for_package

    try:
        create_package(str(root), tmp_path / "ray.zip", include_gitignore=True)
        ray_fails = False
    except IndexError:
        ray_fails = True
    assert ray_fails  # (if Ray reads such a line one day, the zip is no longer needed)
    first = workdir.packed(root, [], tmp_path)
    assert first is not None and workdir.scan(root, []).ray_cannot == [f"{root / '.gitignore'}:2"]
    with ZipFile(first) as zf:
        assert sorted(zf.namelist()) == [".gitignore", "train.py"]
    first.unlink()
    again = workdir.packed(root, [], tmp_path)
    assert again == first and get_uri_for_package(again).startswith("gcs://_ray_pkg_")  # (by content)
    (root / ".gitignore").write_text("data/\n*.log\n")
    assert workdir.packed(root, ["!"], tmp_path) is not None  # (excludes: ['!'])
