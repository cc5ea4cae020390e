"""What a new user's habits and an adversary's inputs found (issue 65), each one line naming the
fix and nothing queued or removed: an empty name never means the default, odd files are read as
git and Ray read them, scripts get the id alone with --parsable. The real `main()` runs in-process
against cluster records in a private RAYSTACK_HOME, as in test_habits.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raystack.store import cluster as clusters
from raystack.store import paths
from raystack.store.cluster import ClusterRecord, ClusterState

from .test_completion import RAYSTACK, complete
from .test_habits import home, queued, run  # noqa: F401 (the fixture)


def ended(name: str) -> None:
    clusters.write(clusters.read(name).model_copy(update={"state": ClusterState.STOPPED}))


@pytest.mark.parametrize(
    "argv",
    [
        ["forget", "", "--yes"],
        ["forget", "other", "", "--yes"],
        ["down", ""],
        ["down", "-c", ""],
        ["status", ""],
        ["queue", "-c", ""],
        ["cancel", ""],
        ["cancel", "", "-c", "other"],
    ],
)
def test_an_empty_name_or_id_is_refused_and_nothing_is_removed(
    home: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    """`raystack forget "$NAME" --yes` with NAME unset removed the only cluster's folder."""
    ended("other")
    code, _, err = run(capsys, *argv)
    assert code == 1 and "empty" in err and len(err.strip().splitlines()) == 1, err
    assert paths.cluster("other").root.is_dir() and paths.cluster("c4").root.is_dir()
    assert not clusters.read("c4").state.is_terminal()


def test_a_long_id_is_echoed_short(home: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, _, err = run(capsys, "job", "a" * 5000, "-c", "c4")
    assert code == 1 and "(5000 characters)" in err and len(err) < 400, err[:500]


SUBMIT = ["submit", "-c", "c4"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([*SUBMIT, "--", ""], "the command after -- starts with an empty word"),
        ([*SUBMIT, "--", " "], "empty"),
        ([*SUBMIT, "ok.yaml", "--set", "stop_grace=99999d"], "the limit of 24h; give less, e.g. 12h"),
        ([*SUBMIT, "ok.yaml", "--set", "timeout=99999d"], "the limit of 365d; give less, e.g. 30d"),
        ([*SUBMIT, "loop.yaml"], "job spec 'loop.yaml' is a loop of symbolic links"),
        ([*SUBMIT, "dangling.yaml"], "'dangling.yaml' points to 'missing.yaml', which does not exist"),
        ([*SUBMIT, "ok.yaml", "--runtime-env", "latin1.yaml"], "latin1.yaml: not UTF-8 text"),
        (["up", "--local", "--max-nodes", "3", "--dry-run"], "--max-nodes: a --local cluster is one node"),
        (["submit", "-c", "loc", "ok.yaml", "-N", "2"], "(a --local cluster is this one machine)"),
    ],
)
def test_odd_input_is_one_line_naming_the_fix(
    home: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    os.symlink("loop.yaml", "loop.yaml")
    os.symlink("missing.yaml", "dangling.yaml")
    Path("latin1.yaml").write_bytes("env_vars: {NAME: caf\xe9}\n".encode("latin-1"))
    clusters.create("loc")
    clusters.write(ClusterRecord(name="loc", backend="local", state=ClusterState.READY, nodes_expected=1))
    before = queued("c4")
    code, _, err = run(capsys, *argv)
    assert code == 1 and says in err and "internal error" not in err, err
    assert queued("c4") == before


def test_excludes_as_a_bare_bang_is_a_pattern_not_none(
    home: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`--set 'excludes=!'` said "valid list (got None)" (YAML reads `!` as an empty tag): a lone
    `!` is a pattern git skips, said with a warning, and the job is checked."""
    code, out, err = run(capsys, "check", "-c", "c4", "ok.yaml", "--set", "excludes=['!']")
    assert code == 0 and "ok:" in out and "excludes: '!' is not a pattern git uses" in caplog.text, err
    code, _, err = run(capsys, "check", "-c", "c4", "ok.yaml", "--set", "excludes=!")
    assert "got None" not in err and "internal error" not in err, err


def test_parsable_submit_prints_the_id_alone(home: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    code, out, _ = run(capsys, "submit", "-c", "c4", "--parsable", "ok.yaml")
    assert code == 0 and len(out.splitlines()) == 1, out
    job_id = out.strip()
    assert (paths.cluster("c4").ledger(job_id)).exists()
    code, out, _ = run(capsys, "submit", "-c", "c4", "--parsable", "ok.yaml", "--sweep", "env.X=1,2")
    assert (
        code == 0
        and len(out.split()) == 2
        and all(paths.cluster("c4").ledger(i).exists() for i in out.split())
    )


def test_grow_takes_the_cluster_as_c_as_every_verb_on_a_cluster_does(
    home: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`grow -c local` was refused (-c was --cpus-per-task there); `up` keeps sbatch's -c."""
    code, _, err = run(capsys, "grow", "-c", "nosuch")
    assert code == 1 and "no cluster named 'nosuch'" in err, err
    code, out, _ = run(capsys, "grow", "--help")
    assert code == 0 and "-c, --cluster NAME" in out and "  --cpus-per-task N" in out, out
    code, out, _ = run(capsys, "up", "--help")
    assert code == 0 and "-c, --cpus-per-task N" in out, out


@pytest.mark.skipif(not RAYSTACK.exists(), reason="the raystack command is not installed beside this Python")
def test_profiles_show_completes_the_profile_names(tmp_path: Path) -> None:
    assert set(complete("raystack profiles show isa", tmp_path)) == {"isambard", "isambard-nccl"}


def test_examples_are_the_debug_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "examples", str(tmp_path / "ex"))
    assert code == 0 and (tmp_path / "ex" / "hello.yaml").is_file() and "raystack submit" in err
    assert {"hello.yaml", "spmd.yaml", "zero3.yaml"} <= {p.name for p in (tmp_path / "ex").glob("*.yaml")}


def test_a_taken_submission_id_is_said_one_way_whichever_check_meets_it(
    home: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two racing submits with one --submission-id: the one that loses meets either the early
    check or the ledger's O_EXCL under the lock; both say the same line (they said two texts)."""
    from raystack.errors import ConfigError
    from raystack.store import queue
    from raystack.store.ledger import JobRequest

    code, out, _ = run(capsys, "submit", "-c", "c4", "--submission-id", "mine-1", "--parsable", "ok.yaml")
    assert code == 0 and out.strip() == "mine-1"
    code, _, err = run(capsys, "submit", "-c", "c4", "--submission-id", "mine-1", "ok.yaml")
    assert code == 1
    with pytest.raises(ConfigError) as raced:  # (the race: past the early check, then the lock)
        queue.enqueue(JobRequest(id="mine-1", name="ok", cluster="c4", entrypoint="true"))
    assert err.strip() == f"raystack: error: {raced.value}", (err, str(raced.value))
