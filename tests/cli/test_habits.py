"""The command line as users type it (sbatch's and `ray job submit`'s habits, typos): every bad
input is one line on stderr naming the fix, with exit 1 (raystack's checks) or 2 (usage), and
nothing is queued. The real `main()` runs in-process against a cluster record in a private
RAYSTACK_HOME (a 4-node x 4-GPU cluster still starting: no SLURM is needed to refuse input)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack.cli import main
from raystack.store import cluster as clusters
from raystack.store import queue
from raystack.store.cluster import ClusterRecord, ClusterState

from ..conftest import wait_until

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "jobs" / "debug" / "hello.yaml"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    monkeypatch.delenv("RAYSTACK_CLUSTER", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("c4", "other"):
        clusters.create(name)
        clusters.write(
            ClusterRecord(
                name=name, state=ClusterState.STARTING, nodes_expected=4, gpus_per_node=4, cpus_per_node=16
            )
        )
    (work / "ok.yaml").write_text(HELLO.read_text())
    (work / "specs").mkdir()
    (work / "specs" / "a.yaml").write_text(HELLO.read_text())
    (work / "ok2.YAML").write_text(HELLO.read_text())
    (tmp_path / "odd" / "dir.yaml").mkdir(parents=True)  # (beside the work folder: its specs upload it)
    os.mkfifo(tmp_path / "odd" / "pipe.yaml")
    return work


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    sys.argv = ["raystack", *argv]
    with pytest.raises(SystemExit) as done:
        main()
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def queued(name: str = "c4") -> int:
    return len(queue.waiting(name))


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["ok.yaml", "--folow"], 2, "No such option: --folow"),
        (["hello.yam"], 1, "'hello.yam' is not a job spec (.yaml); a command goes after --"),
        (["nope.yaml"], 1, "no job spec 'nope.yaml' (no such file)"),
        (["../odd/dir.yaml"], 1, "job spec '../odd/dir.yaml' is a folder: give a YAML file"),
        (["../odd/pipe.yaml"], 1, "job spec '../odd/pipe.yaml' is a FIFO (named pipe): give a YAML file"),
        (["specs"], 1, "'specs' is a folder, not a job spec: give a .yaml file in it (e.g. specs/a.yaml)"),
        (["train.py"], 1, "a command goes after --: raystack submit -c c4 -- python train.py"),
        (["okk.yaml"], 1, "did you mean ok.yaml?"),
        (["python", "train.py", "-c", "config.yaml"], 1, "a command goes after --: raystack submit"),
        (["ok.yaml", "--", "python", "x.py"], 1, "give a job spec or a command after --, not both"),
        (["--"], 1, "nothing after --"),
        (
            ["ok.yaml", "--set", "env.LR", "1e-6"],
            1,
            "'1e-6' after the job spec ok.yaml: each option takes one word",
        ),
        (
            ["ok.yaml", "--sweep", "env.LR=1,2", "3"],
            1,
            "'3' after the job spec ok.yaml: each option takes one",
        ),
        (["ok.yaml", "ok.yaml"], 1, "one job spec per submit: ok.yaml, then ok.yaml on its own"),
        ([], 1, "give a job spec or a command after --"),
    ],
)
def test_submit_never_swallows_what_was_typed(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, says: str
) -> None:
    got, _, err = run(capsys, "submit", "-c", "c4", *argv)
    assert got == code and says in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert queued() == 0


def test_check_s_hint_for_a_bare_command_names_check(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "-c", "c4", "python", "train.py")
    assert code == 1 and "a command goes after --: raystack check -c c4 -- python train.py" in err, err


def test_a_bare_command_hint_keeps_the_scripts_own_flags(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-c config.yaml` of the script is not taken as the cluster: the hint puts it after --."""
    code, _, err = run(capsys, "submit", "-c", "c4", "python", "train.py", "-c", "config.yaml")
    assert code == 1
    assert "raystack submit -c c4 -- python train.py -c config.yaml" in err, err


def test_a_command_after_dashes_is_taken_verbatim(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "submit", "-c", "c4", "--json", "--", "python", "t.py", "-c", "x.yaml", "--follow"
    )
    assert code == 0, err
    job = queue.waiting("c4")[0].job_id
    from raystack.store.ledger import read_job

    assert read_job("c4", job).request.entrypoint == "python t.py -c x.yaml --follow"


def test_a_spec_file_in_upper_case_is_a_spec(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "submit", "--cluster", "c4", "ok2.YAML")
    assert code == 0, err
    assert queued() == 1


def test_every_verb_takes_the_cluster_as_positional_or_option(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["queue", "c4"], ["queue", "-c", "c4"], ["queue", "--cluster", "c4"]):
        code, _, err = run(capsys, *argv, "--json")
        assert code == 0, (argv, err)
    code, _, err = run(capsys, "queue", "c4", "-c", "other")
    assert code == 1 and "two clusters named: 'c4' and --cluster 'other'" in err


def test_raystack_cluster_is_the_default_cluster(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "submit", "ok.yaml")
    assert code == 1 and "several clusters" in err  # (two clusters: which one?)
    monkeypatch.setenv("RAYSTACK_CLUSTER", "other")
    code, _, err = run(capsys, "submit", "ok.yaml")
    assert code == 0 and queued("other") == 1, err
    monkeypatch.setenv("RAYSTACK_CLUSTER", "gone")
    code, _, err = run(capsys, "queue")
    assert code == 1 and "no cluster named 'gone' (from $RAYSTACK_CLUSTER)" in err


def test_a_job_verb_on_a_cluster_that_does_not_exist_says_so(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "logs", "abc-12345678", "-c", "grpo")
    assert code == 1 and "no cluster named 'grpo'" in err, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            [
                "plan",
                "grpo",
                "--learners",
                "0",
                "--nodes",
                "2",
                "--gpus-per-node",
                "4",
                "--cpus-per-node",
                "32",
            ],
            "'--learners'",
        ),
        (
            [
                "plan",
                "grpo",
                "--learners",
                "4",
                "--tp",
                "0",
                "--nodes",
                "2",
                "--gpus-per-node",
                "4",
                "--cpus-per-node",
                "32",
            ],
            "'--tp'",
        ),
        (["plan", "memory", "--gpu-memory-utilization", "2"], "'--gpu-memory-utilization'"),
        (["up", "-N", "0"], "'--nodes'"),
        (["up", "--bogus"], "No such option: --bogus"),
    ],
)
def test_bad_numbers_are_usage_errors_in_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def up_dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code, out, err = run(capsys, "up", "-P", "testbed", "--dry-run", "--json", *argv)
    if code:
        return code, [], err
    return code, json.loads(out)["argv"], err


def test_sbatchs_letters_mean_what_they_mean_in_sbatch(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, argv, err = up_dry_run(
        capsys, "-N", "4", "-p", "gpu", "-t", "12:00:00", "-A", "proj", "-J", "grpo", "-q", "high",
        "-C", "a100", "-c", "8", "--mem", "200G", "--exclusive", "--reservation", "r1", "--gres", "nvme:1",
        "--gpus-per-node", "volta:2",
    )  # fmt: skip
    assert code == 0, err
    for option in (
        "--nodes=4", "--partition=gpu", "--time=12:00:00", "--account=proj", "--job-name=raystack-grpo",
        "--qos=high", "--constraint=a100", "--cpus-per-task=8", "--mem=200G", "--exclusive",
        "--reservation=r1", "--gres=nvme:1", "--gpus-per-node=volta:2",
    ):  # fmt: skip
        assert argv.count(option) == 1, (option, argv)


@pytest.mark.parametrize(
    ("value", "sbatch_text"),
    [("2h", "--time=2:00:00"), ("30", "--time=30"), ("1-00:00:00", "--time=1-00:00:00")],
)
def test_time_takes_slurms_forms_and_units(
    home: Path, capsys: pytest.CaptureFixture[str], value: str, sbatch_text: str
) -> None:
    code, argv, err = up_dry_run(capsys, "-t", value)
    assert code == 0 and sbatch_text in argv, err


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("--sbatch=--nodes=8", "use -N/--nodes"),
        ("--sbatch=--time=10", "use -t/--time"),
        ("--sbatch=--array=1-3", "--chain"),
        ("--sbatch=--ntasks-per-node=4", "one node program per node"),
        ("--sbatch=--job-name=x", "use -J/--name"),
        ("--sbatch=--signal=USR1@60", "use --signal-lead"),
        ("--sbatch=-pgpu", "use -p/--partition"),
    ],
)
def test_sbatch_cannot_override_what_raystack_owns(
    home: Path, capsys: pytest.CaptureFixture[str], option: str, says: str
) -> None:
    code, _, err = up_dry_run(capsys, option)
    assert code == 1 and says in err and len(err.strip().splitlines()) == 1, err


def test_sbatch_short_forms_reach_sbatch_as_long_ones(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, argv, err = up_dry_run(capsys, "--sbatch=-w node1", "--sbatch=--mail-type=END")
    assert code == 0 and "--nodelist=node1" in argv and "--mail-type=END" in argv, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--idle-timeout", "soon"], "--idle-timeout: 'soon' is not a duration"),
        (["-t", "0"], "--time: '0' is no time at all"),
        (["-t", "2x"], "--time: '2x' is not a duration"),
        (["--timeout", "never-ish"], "--timeout: 'never-ish' is not a duration"),
        (["--gpus-per-node", "volta:two"], "--gpus-per-node: 'volta:two' is not a GPU count"),
    ],
)
def test_bad_durations_and_counts_on_up(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, _, err = up_dry_run(capsys, *argv)
    assert code == 1 and says in err, err


def test_an_unexpected_error_is_one_line_not_a_traceback(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from raystack.client import Cluster

    def boom(*_a: object, **_k: object) -> None:
        raise ZeroDivisionError("integer division or modulo by zero")

    monkeypatch.setattr(Cluster, "queue", boom)
    code, _, err = run(capsys, "queue", "c4")
    assert code == 1 and "internal error: ZeroDivisionError" in err and "RAYSTACK_DEBUG=1" in err
    assert len(err.strip().splitlines()) == 1, err


def test_help_has_no_placeholders_and_h_is_help(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("up", "submit", "queue", "logs", "status", "plan"):
        code, out, _ = run(capsys, verb, "-h")
        assert code == 0 and "Usage: raystack" in out
        assert (
            "<list[str]>" not in out and "{args}" not in out and "<str>" not in out and "<int>" not in out
        ), out


def queue_two(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """Two jobs on c4; the first started (RUNNING in allocation 7), the second waiting."""
    from raystack.store.ledger import JobState, update_job

    ids = []
    for name in ("first", "second"):
        code, out, err = run(
            capsys, "submit", "-c", "c4", "--json", "--set", f"name={name}", "--", "python", "x.py"
        )
        assert code == 0, err
        ids.append(json.loads(out)["id"])
    entry = queue.waiting("c4")[0]
    assert queue.start("c4", entry, "7") is not None
    update_job("c4", ids[0], state=JobState.RUNNING, started=1.0)
    return ids[0], ids[1]


@pytest.fixture
def small_rs(tmp_path: Path) -> Iterator[Path]:
    """RAYSTACK_HOME (tmp_path/rs) on a 4 MiB filesystem of its own: a tmpfs (root can mount one,
    as CI and the testbed do). Ask for it before `home`."""
    mount = tmp_path / "rs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"no tmpfs can be mounted here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_the_log_of_a_running_job_on_a_full_filesystem_says_why_it_stops_growing(
    small_rs: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full quota stops the runner from copying a running job's log; `logs` printed what it had
    and nothing said why it no longer grew."""
    from raystack.store import paths

    running, _ = queue_two(capsys)
    log = paths.cluster("c4").job_log(running, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 1\n")
    code, out, err = run(capsys, "logs", running, "-c", "c4")
    assert code == 0 and out == "step 1\n" and "note:" not in err, err
    filler = small_rs / "filler"
    with open(filler, "wb") as fh, pytest.raises(OSError) as full:
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    assert full.value.errno == errno.ENOSPC
    code, out, err = run(capsys, "logs", running, "-c", "c4")
    said = f"raystack: note: the filesystem of {paths.cluster('c4').root} is full (0 KiB free): this log "
    assert code == 0 and out == "step 1\n" and said + "stops growing until there is room" in err, err
    filler.unlink()
    code, out, err = run(capsys, "logs", running, "-c", "c4")
    assert code == 0 and out == "step 1\n" and "note:" not in err, err


def test_on_a_full_filesystem_queue_and_job_say_the_states_may_lag(
    small_rs: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 65: while RAYSTACK_HOME was full a job that had ended showed RUNNING (the runner cannot
    write the ledger) and nothing said why. `queue` and `job` say the states may lag, until there
    is room; a job that ended says nothing of it."""
    running, _ = queue_two(capsys)
    code, _, err = run(capsys, "queue", "-c", "c4")
    assert code == 0 and "note:" not in err, err
    filler = small_rs / "filler"
    with open(filler, "wb") as fh, pytest.raises(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    lag = "the queue runner cannot record jobs' ends or start the next until there is room"
    code, out, err = run(capsys, "queue", "-c", "c4")
    assert code == 0 and running in out and f"is full (0 KiB free): {lag}" in err, err
    code, out, err = run(capsys, "job", running, "-c", "c4")
    assert code == 0 and "RUNNING" in out and lag in err, err
    code, out, _ = run(capsys, "job", running, "-c", "c4", "--json")
    assert code == 0 and lag in json.loads(out)["note"]
    filler.unlink()
    code, out, err = run(capsys, "job", running, "-c", "c4", "--json")
    assert code == 0 and json.loads(out)["note"] is None and "note:" not in err


def test_a_queued_job_says_where_it_waits(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, waiting = queue_two(capsys)
    code, out, err = run(capsys, "logs", waiting, "-c", "c4")
    assert code == 0 and out == ""
    assert f"job {waiting} queued, next (running: first, " in err and "cluster STARTING" in err, err
    code, out, _ = run(capsys, "job", waiting, "--json")
    row = json.loads(out)
    assert (
        code == 0
        and row["state"] == "QUEUED"
        and row["position"] == 1
        and row["waiting"].startswith("queued, next")
    )


def test_ctrl_c_of_a_follow_says_the_job_goes_on_and_the_wait_is_said_once(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C ends the follow, not the job: exit 130 with its state and the commands for it. While
    it waits, the line is said again when more than the running job's time changed."""
    import signal
    import time

    from raystack.store.ledger import update_job

    first, waiting = queue_two(capsys)
    update_job("c4", first, started=time.time() - 30)  # (its time in the line moves every second)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 5.5)
    try:
        code, out, err = run(capsys, "logs", waiting, "-f")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert code == 130 and out == "", err
    assert err.count(f"job {waiting} queued, next (running: first, ") == 1, err
    assert (
        f"raystack: interrupted; job {waiting} is still QUEUED; follow it again: raystack logs {waiting} -f, "
        f"stop it: raystack stop {waiting}" in err
    ), err
    assert queue.position("c4", waiting) == 1  # (nothing changed for the job)


def test_a_job_taken_from_the_queue_says_it_starts_not_that_it_waits_for_itself(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Between the runner taking a job and Ray accepting it, the ledger still says QUEUED: the
    line is `starting now`, never `running: <itself>`."""
    first, _ = queue_two(capsys)
    from raystack.store.ledger import JobState, update_job

    update_job("c4", first, state=JobState.QUEUED, started=None)
    code, out, _ = run(capsys, "job", first, "--json")
    row = json.loads(out)
    assert code == 0 and row["waiting"] == "queued, starting now", row


def test_a_job_queued_while_the_allocation_ends_is_told_where_it_will_run(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At the walltime warning nothing more starts in the allocation: submit, `job` and the
    waiting line say so, and where the queue goes on (the follow-on, or a new `up`)."""
    from raystack.store.cluster import EndKind

    # (no allocation id: SLURM is not asked about one; the testbed's job 7 has long ended)
    clusters.update("c4", state=ClusterState.READY, ending=EndKind.WALLTIME)
    code, _, err = run(capsys, "submit", "-c", "c4", "--", "python", "x.py")
    says = "note: the allocation is ending (walltime): nothing more starts in it; no allocation follows: "
    assert code == 0 and says + "`raystack up --name c4 ...` runs the queue again" in err, err
    clusters.update("c4", next_allocation_id="8")
    code, out, _ = run(capsys, "queue", "c4", "--json")
    job = json.loads(out)[0]["id"]
    code, out, _ = run(capsys, "job", job, "--json")
    assert code == 0 and "queued jobs start in the next one (8, pending)" in json.loads(out)["waiting"]
    clusters.update("c4", ending=None)
    code, _, err = run(capsys, "submit", "-c", "c4", "--", "python", "x.py")
    assert code == 0 and "note:" not in err, err


def test_queue_filters_by_state_and_refuses_an_unknown_one(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    running, waiting = queue_two(capsys)
    code, out, _ = run(capsys, "queue", "c4", "--state", "running", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [running]
    code, out, _ = run(capsys, "queue", "c4", "-s", "queued,RUNNING", "--json")
    assert code == 0 and {r["id"] for r in json.loads(out)} == {running, waiting}
    code, _, err = run(capsys, "queue", "c4", "--state", "runing")
    assert code == 1 and "--state: no job state 'RUNING'; did you mean RUNNING?" in err


def test_logs_tail_shows_the_last_lines(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running, _ = queue_two(capsys)
    from raystack.store import paths

    log = paths.cluster("c4").job_log(running, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"line {i}\n" for i in range(1, 101)))
    code, out, _ = run(capsys, "logs", running, "--tail", "3")
    assert code == 0 and out == "line 98\nline 99\nline 100\n"


def test_forget_removes_an_ended_cluster_and_refuses_a_live_one(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raystack.store import paths

    code, _, err = run(capsys, "forget", "c4", "--yes")
    assert code == 1 and "c4 still live: `raystack down c4` first" in err
    record = clusters.read("other").model_copy(update={"state": ClusterState.STOPPED})
    clusters.write(record)
    code, _, err = run(capsys, "forget", "other")  # (no terminal: --yes is needed)
    assert code == 1 and "add --yes" in err and paths.cluster("other").root.exists()
    code, out, _ = run(capsys, "forget", "other", "-y")
    assert code == 0 and "removed" in out and not paths.cluster("other").root.exists()
    assert clusters.list_names() == ["c4"]


def test_down_all_asks_first(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "down", "--all")
    assert (
        code == 1
        and "Stop 2 cluster(s): c4 (STARTING), other (STARTING)? Not on a terminal: add --yes" in err
    )
    assert all(not clusters.read(n).state.is_terminal() for n in ("c4", "other"))


def test_check_validates_a_spec_against_a_profile_without_a_cluster(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "big.yaml").write_text("name: big\nentrypoint: python x.py\nmin_time: 3h\nneeds: {gpus: 8}\n")
    code, out, err = run(capsys, "check", "big.yaml", "-P", "testbed", "-N", "2")
    assert code == 1 and "min_time 3h but the cluster of profile testbed gets 2h per allocation" in err, err
    code, out, err = run(capsys, "check", "big.yaml", "-P", "testbed", "-N", "1", "--set", "min_time=1h")
    assert code == 1 and "needs.gpus=8 but the cluster of profile testbed has 1 node x 4 GPUs" in err, err
    code, out, err = run(
        capsys, "check", "big.yaml", "-c", "c4", "--set", "min_time=1h", "--set", "needs.gpus=64"
    )
    assert code == 1 and "needs.gpus=64 but cluster 'c4' has" in err, (
        err
    )  # (a cluster's own record: its name)
    code, out, err = run(capsys, "check", "big.yaml", "-P", "testbed", "-N", "2", "--set", "min_time=1h")
    assert code == 0 and "ok: big can run on profile testbed (2 node(s) of 4 GPUs)" in out, err
    assert queued() == 0


def test_check_against_a_cluster_knows_its_jobs_for_after(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "dep.yaml").write_text("name: dep\nentrypoint: python x.py\nafter: [trian-1]\n")
    code, _, err = run(capsys, "check", "dep.yaml", "-c", "c4")
    assert code == 1 and "after: trian-1: no job or sweep 'trian-1' in cluster c4" in err, err
    code, out, err = run(capsys, "check", "dep.yaml", "-P", "testbed")  # (no ledger to ask: not checked)
    assert code == 0 and "ok: dep can run on profile testbed" in out, err
    first = json.loads(run(capsys, "submit", "-c", "c4", "--json", "--", "python", "t.py")[1])
    code, out, err = run(capsys, "check", "dep.yaml", "-c", "c4", "--set", f"after=[{first['id']}]")
    assert code == 0 and "ok: dep can run on cluster c4" in out, err


def test_check_takes_submits_sweep_and_after_and_checks_every_combination(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check had no --sweep or --after: a sweep could be checked only by submitting it."""
    (home / "sw.yaml").write_text("name: sw\nentrypoint: python x.py\nsweep: {env.LR: [1, 2, 3]}\n")
    code, out, err = run(capsys, "check", "sw.yaml", "-c", "c4", "--sweep", "env.B=x,y")
    assert code == 0 and "ok: sw can run on cluster c4 (its sweep: 6 jobs, each checked" in out, err
    code, _, err = run(capsys, "check", "sw.yaml", "-c", "c4", "--sweep", "needs.gpus=1,99")
    assert code == 1 and "needs.gpus=99" in err, err  # (the second combination's)
    code, _, err = run(capsys, "check", "sw.yaml", "-c", "c4", "--after", "trian-1")
    assert code == 1 and "--after trian-1: no job or sweep 'trian-1' in cluster c4" in err, err
    code, _, err = run(capsys, "check", "sw.yaml", "-c", "c4", "--after", "x:maybe")
    assert code == 1 and "--after 'x:maybe': give a job or sweep id" in err, err
    first = json.loads(run(capsys, "submit", "-c", "c4", "--json", "--", "python", "t.py")[1])
    code, out, err = run(capsys, "check", "sw.yaml", "-c", "c4", "--after", f"{first['id']}:ok", "--json")
    assert code == 0 and json.loads(out)["jobs"] == 3, err
    assert queued() == 1  # (only the job submitted above)


def test_submit_refuses_what_could_never_start(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = clusters.read("c4").model_copy(update={"walltime": 3600.0})
    clusters.write(record)
    code, _, err = run(capsys, "submit", "-c", "c4", "--set", "min_time=2h", "--", "python", "x.py")
    assert code == 1 and "min_time 2h but cluster 'c4' gets 1h per allocation: it would never start" in err
    code, _, err = run(
        capsys, "submit", "-c", "c4", "--set", "entrypoint_resources={TPU: 4}", "--", "python", "x.py"
    )
    assert code == 1 and "no node of cluster 'c4' has a resource 'TPU'" in err
    assert queued() == 0


def test_profiles_lists_and_shows(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "profiles", "--json")
    names = {p["name"] for p in json.loads(out)}
    assert code == 0 and {"generic", "isambard", "isambard-nccl", "brtx", "supercloud", "testbed"} <= names
    code, out, _ = run(capsys, "profiles", "show", "isambard", "--json")
    assert code == 0 and json.loads(out)["exclusive"] is True
    code, _, err = run(capsys, "profiles", "show", "isambrd")
    assert code == 1 and "did you mean 'isambard'?" in err
    code, out, _ = run(capsys, "profiles", "isambard", "--json")  # (without `show`, as people type it)
    assert code == 0 and json.loads(out)["name"] == "isambard"
    code, _, err = run(capsys, "profiles", "isambrd")
    assert code == 1 and "did you mean 'isambard'?" in err
    code, _, err = run(capsys, "up", "-P", "mysite.yaml", "--dry-run")
    assert code == 1 and "no profile file mysite.yaml" in err and "mysite.yaml.yaml" not in err


def test_an_unusable_raystack_home_is_named_with_the_fix_not_called_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """RAYSTACK_HOME that is a file (or missing, read-only, full): one line naming it and the fix."""
    not_a_folder = tmp_path / "home-is-a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("RAYSTACK_HOME", str(not_a_folder))
    code, _, err = run(capsys, "up", "--local", "--no-wait")
    assert code == 1 and "internal error" not in err, err
    assert (
        f"{not_a_folder}/clusters: Not a directory (RAYSTACK_HOME is {not_a_folder}: set RAYSTACK_HOME" in err
    )
    assert len(err.strip().splitlines()) == 1


def test_listing_no_clusters_says_how_to_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "empty"))
    code, out, err = run(capsys, "list")
    assert code == 0 and out == "" and "no clusters in" in err and "raystack up --nodes N" in err
    code, out, _ = run(capsys, "list", "--json")
    assert code == 0 and json.loads(out) == []


def test_check_without_a_job_names_check_not_submit(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check")
    assert (
        code == 1 and "raystack check job.yaml, raystack check -- python x.py" in err and "submit" not in err
    )


def test_top_of_an_ended_cluster_shows_its_end_once(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not a live view that never changes (it waited for Ctrl-C, printing nothing into a pipe):
    the last state, why it ended, no time left; exit 1 as `status` does."""
    clusters.update(
        "c4", state=ClusterState.STOPPED, message="allocation 8 ended (raystack down)", walltime_end=4e9
    )
    code, out, _ = run(capsys, "top", "c4")
    assert code == 1 and "STOPPED" in out and "ended: allocation 8 ended (raystack down)" in out, out
    assert "time left -" in out, out


def test_an_ended_clusters_stale_dashboard_is_not_offered(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clusters.update("c4", state=ClusterState.STOPPED, message="stopped", dashboard_url="http://10.0.0.1:8265")
    for argv in (["list"], ["status", "c4"]):
        _, out, err = run(capsys, *argv)
        assert "10.0.0.1:8265" not in out and "STOPPED" in out, out + err


def test_top_into_a_pipe_shows_one_snapshot(home: Path) -> None:
    """A live view into a pipe or a file wrote nothing until Ctrl-C (and nothing at all when
    killed, as `timeout 60 raystack top > top.txt` does): one snapshot, as --once."""
    done = subprocess.run(
        [sys.executable, "-m", "raystack", "top", "c4"], capture_output=True, text=True, timeout=120
    )
    assert "c4" in done.stdout and "STARTING" in done.stdout, done.stdout + done.stderr


def test_plan_grpo_without_a_shape_names_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "grpo", "--learners", "8", "--nodes", "2", "--gpus-per-node", "4")
    assert code == 1 and "(--cpus-per-node missing; e.g. Isambard's GH200 nodes:" in err, err
    code, out, _ = run(
        capsys,
        "plan",
        "grpo",
        "--learners",
        "4",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--cpus-per-node",
        "72",
    )
    assert code == 0 and "--vllm_num_engines" in out


def test_a_follow_keeps_a_character_split_between_reads_and_ends_an_open_line(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a UTF-8 character (a progress bar's █) split between two reads of the log came out
    as two replacement characters, and output without a final newline ran into the next line."""
    import io
    import threading

    from raystack.client import Job
    from raystack.store import paths
    from raystack.store.ledger import JobState, update_job

    first, _ = queue_two(capsys)
    log = paths.cluster("c4").job_log(first, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    bar = "step 1 █\nstep 2 █".encode()
    log.write_bytes(bar[:-2])  # (the last character cut after its first byte)
    out = io.StringIO()

    def rest() -> None:
        wait_until(lambda: out.getvalue(), timeout=10, what="the first read")
        with open(log, "ab") as fh:
            fh.write(bar[-2:])
        update_job("c4", first, state=JobState.SUCCEEDED)

    writer = threading.Thread(target=rest)
    writer.start()
    record = Job("c4", first).follow(out=out, poll=0.01, say=lambda line: None)
    writer.join()
    assert record.state is JobState.SUCCEEDED
    assert out.getvalue() == "step 1 █\nstep 2 █\n"


def test_bare_raystack_is_usage_not_success() -> None:
    """`raystack` alone printed the help and exited 0, as if a command had run (a script's `&&`
    went on); it is usage (exit 2), as `raystack plan` without its verb; `--help` is 0."""
    for argv, code in (([], 2), (["plan"], 2), (["--help"], 0)):
        done = subprocess.run([sys.executable, "-m", "raystack.cli", *argv], capture_output=True, text=True)
        assert done.returncode == code and "Usage" in done.stdout, (argv, done)


def test_sbatch_letters_on_submit_set_the_fields_they_mean(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SLURM user's `submit -N 2 -t 10 --gpus 1`: -N is a Ray job's needs.nodes and an SPMD job's
    nodes, -t its timeout in SLURM's forms (10 = 10 minutes), --gpus needs.gpus; -p is refused
    with where a partition goes, and nothing is queued by it."""
    from raystack.store.ledger import read_job

    code, _, err = run(
        capsys, "submit", "ok.yaml", "-c", "c4", "-N", "2", "-t", "10", "--gpus", "1", "--json"
    )
    assert code == 0, err
    request = read_job("c4", read_job_ids("c4")[-1]).request
    assert request.needs == {"nodes": 2, "gpus": 1} and request.timeout == 600, request
    trl = REPO / "jobs" / "grpo_tiny" / "trl_grpo.yaml"  # (kind: spmd)
    code, _, err = run(capsys, "submit", str(trl), "-c", "c4", "-N", "2", "-t", "1:30:00")
    assert code == 0, err
    request = read_job("c4", read_job_ids("c4")[-1]).request
    # (its nodes are what it occupies: the queue packs and grows for them as for needs.nodes)
    assert "--nodes=2 " in request.entrypoint and request.timeout == 5400 and request.needs == {"nodes": 2}
    before = queued()
    code, _, err = run(capsys, "submit", "ok.yaml", "-c", "c4", "-p", "gpu")
    assert code == 1 and queued() == before
    assert (
        "-p/--partition gpu: " in err and "raystack up -p gpu" in err and len(err.strip().splitlines()) == 1
    )


def read_job_ids(name: str) -> list[str]:
    from raystack.store.ledger import all_jobs

    return [r.id for r in sorted(all_jobs(name), key=lambda r: r.request.queued_at or 0)]


def test_what_a_job_wrote_cannot_clear_the_screen_of_queue_or_job(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job whose last stderr line is `ESC[2J` (clear screen) and a sweep value holding ESC: queue
    and job render them without the escape (control characters escaped), --json keeps the text
    as it is (JSON escapes it), and logs stays byte-exact."""
    from raystack.store.ledger import JobState, update_job

    running, _ = queue_two(capsys)
    update_job("c4", running, state=JobState.FAILED, ended=2.0, message="boom\x1b[2J\x1b[31mred\x07")
    code, out, err = run(capsys, "submit", "-c", "c4", "--sweep", "env.X=a\x1b[1mb", "--", "echo", "$X")
    assert code == 0, err
    for argv in (("queue", "c4", "--all"), ("job", running, "-c", "c4")):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert "\x1b" not in out + err and "\x07" not in out + err, (argv, out)
        assert "boomred" in out.replace("\\x07", ""), out
    code, out, _ = run(capsys, "job", running, "-c", "c4", "--json")
    assert json.loads(out)["message"] == "boom\x1b[2J\x1b[31mred\x07"


def test_an_interrupted_jobs_duration_is_what_it_ran(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job INTERRUPTED at its allocation's end waits for the next one: its duration is the time
    it ran until then, not a clock that keeps going while it waits."""
    import time

    from raystack.store.ledger import JobState, read_job, update_job

    running, _ = queue_two(capsys)
    update_job("c4", running, started=time.time() - 50)
    update_job("c4", running, state=JobState.INTERRUPTED)
    stopped = read_job("c4", running).time_in(JobState.INTERRUPTED) or 0
    ran = stopped - (read_job("c4", running).started or 0)
    time.sleep(1.5)
    code, out, _ = run(capsys, "queue", "c4", "--all", "--json")
    row = next(r for r in json.loads(out) if r["id"] == running)
    assert code == 0 and row["state"] == "INTERRUPTED" and abs(row["duration_s"] - ran) < 0.01, (row, ran)


def test_a_bad_cluster_name_is_blamed_on_what_was_typed(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-c is --cluster on job verbs (and --cpus-per-task on up): a bad name given with -c is not
    called --name; one from $RAYSTACK_CLUSTER names the variable."""
    code, _, err = run(capsys, "queue", "-c", "bad name")
    assert code == 1 and "--cluster/-c" in err and "--name" not in err, err
    code, _, err = run(capsys, "logs", "x-1", "-c", "jöb")
    assert code == 1 and "--cluster/-c" in err and "it holds 'ö'" in err, err


def test_hints_start_a_local_cluster_again_with_local(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hint on a stopped cluster says how it was made: a local one's `raystack up` has --local
    (typed without it, it would go to SLURM); a SLURM one's has none."""
    for name, backend in (("loc", "local"), ("c4", "slurm")):
        if name == "loc":
            clusters.create(name)
        record = clusters.read(name) if name == "c4" else ClusterRecord(name=name, nodes_expected=1)
        clusters.write(record.model_copy(update={"state": ClusterState.STOPPED, "backend": backend}))
    code, _, err = run(capsys, "submit", "-c", "loc", "--", "true")
    assert code == 1 and "`raystack up --name loc --local ...`" in err, err
    code, _, err = run(capsys, "submit", "-c", "c4", "--", "true")
    assert code == 1 and "`raystack up --name c4 ...`" in err and "--local" not in err, err
