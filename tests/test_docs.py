"""The README and docs/ tell the truth about the command line, and the reference pages are the
code's: every `raystack ...` command they show exists, with the options it is shown with; the
generated pages are up to date; the site builds with warnings as errors; the README stays short
and speaks of raystack, its users and their sites only."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from raystack.cli.common import app

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))
PAGES = [README, *DOCS]
STOP = {"|", ";", "&&", "||", ">", "2>&1", "#"}


def shown_commands(text: str) -> list[str]:
    """Every `raystack ...` command in code blocks and inline code, as written."""
    found = []
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    for line in [ln for b in blocks for ln in b.splitlines()] + inline:
        if "│" in line or line.lstrip().startswith(("Usage:", "#")):
            continue  # (a picture, a usage line of the generated reference, a comment)
        for match in re.finditer(r"(?:^\s*|\$\(|&& |; |\| )(raystack(?: [^\n\"`)]*)?)", line):
            command = match.group(1).split("  #")[0].split(" # ")[0].strip()
            first = command.split()[1] if len(command.split()) > 1 else ""
            if not first.endswith(":"):  # ("raystack spmd: node 1 ..." is output)
                found.append(command)
    return found


def words(command: str) -> list[str]:
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    out = []
    for token in tokens[1:]:
        if token in STOP or token.startswith("#"):
            break
        out.append(token.strip("[]"))
    return [t for t in out if t and t != "..."]


def check(command: str, root: Any) -> str | None:
    """None when the command line parses as far as names go; else what is wrong."""
    ctx = typer.Context(root, info_name="raystack")
    cmd, tokens, path = root, words(command), ["raystack"]
    while hasattr(cmd, "list_commands"):
        names = [t for t in tokens if not t.startswith("-")]
        if not names:
            return None  # (a group with its own options, e.g. `raystack profiles --json`)
        sub = cmd.get_command(ctx, names[0])
        if sub is None:
            if cmd is root or names[0] not in ("NAME", "CLUSTER"):
                return f"{' '.join(path)} has no command {names[0]!r}"
            return None
        tokens = tokens[tokens.index(names[0]) + 1 :]
        path.append(names[0])
        cmd = sub
    options = {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]} | {"-h", "--help"}
    for token in tokens:
        if token == "--":
            break
        if token.startswith("-") and token != "-" and not re.fullmatch(r"-\d.*", token):
            name = token.split("=", 1)[0]
            if name not in options:
                return f"{' '.join(path)} has no option {name}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_shown_exists_with_its_options(page: Path) -> None:
    root = typer.main.get_command(app)
    problems = []
    for command in shown_commands(page.read_text()):
        wrong = check(command, root)
        if wrong:
            problems.append(f"{command!r}: {wrong}")
    assert not problems, "\n".join(problems)


def test_the_walker_would_catch_a_wrong_command() -> None:
    root = typer.main.get_command(app)
    assert check("raystack up -N 4 -P isambard --tim 2h", root) == "raystack up has no option --tim"
    assert check("raystack statsu grpo", root) == "raystack has no command 'statsu'"
    assert check("raystack plan grpo --learners 8 --tp 2", root) is None
    assert check("raystack submit -c grpo -- python x.py --lr 1", root) is None
    assert shown_commands('a `raystack logs ID -f` and\n```\neval "$(raystack env grpo)"\n```') == [
        "raystack env grpo",
        "raystack logs ID -f",
    ]


def test_the_generated_references_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "docs" / "gen.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr + "  (run: python docs/gen.py)"


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    text = README.read_text()
    assert len(text.split()) <= 1500, f"README: {len(text.split())} words (at most 1,500)"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (REPO / target).exists(), f"README links to {target}, which does not exist"
    assert "make test" in text and "make demo" in text
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_the_docs_speak_of_raystack_and_its_users_only() -> None:
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"shared/seeds|\bseeds?\b \d{3}|\bseed's\b", text, re.I), page


@pytest.mark.skipif(
    shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None, reason="mkdocs not installed"
)
def test_the_docs_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_docs_stay_short() -> None:
    """docs/ (its pages and the generated references) under 25,000 words: a word holds a letter or a
    digit (a table's pipes and rules are not words; `wc -w` counts them too)."""
    text = " ".join(p.read_text() for p in sorted(REPO.joinpath("docs").rglob("*.md")))
    words = [w for w in text.split() if re.search(r"[A-Za-z0-9]", w)]
    assert len(words) < 25_000, f"docs/: {len(words)} words (at most 25,000): say it shorter"
