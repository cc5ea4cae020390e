"""Jobs as researchers write them, at submit (no cluster needed: a record in a private
RAYSTACK_HOME): Ray's whole runtime_env, `ray job submit`'s flags, sweeps and dependencies.
Bad input is one line naming the key and the fix, and nothing is queued."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from raystack.store import queue
from raystack.store.ledger import JobState, read_job, update_job

from .test_habits import home, run  # noqa: F401 (home is a fixture)

pytestmark = pytest.mark.usefixtures("home")


def submitted(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    code, out, err = run(capsys, "submit", "-c", "c4", "--json", *argv)
    assert code == 0, err
    rows = json.loads(out)
    return rows if isinstance(rows, list) else [rows]


def request(job_id: str):  # type: ignore[no-untyped-def]
    return read_job("c4", job_id).request


def test_a_runtime_env_in_the_spec_reaches_the_request(capsys: pytest.CaptureFixture[str]) -> None:
    Path("lib/mypkg").mkdir(parents=True)
    Path("lib/mypkg/__init__.py").write_text("X = 1\n")
    Path("requirements.txt").write_text("# ours\nrequests>=2\n\nnumpy  # fast\n")
    Path("job.yaml").write_text(
        "name: renv\nentrypoint: python -c 'import mypkg'\nenv: {A: '1'}\n"
        "runtime_env:\n  py_modules: [lib/mypkg]\n  pip: requirements.txt\n"
        "  env_vars: {B: '2'}\n  config: {setup_timeout_seconds: 120}\n"
    )
    [row] = submitted(capsys, "job.yaml")
    req = request(row["id"])
    assert req.runtime_env["py_modules"] == [str(Path("lib/mypkg").resolve())]
    assert req.runtime_env["pip"] == ["requests>=2", "numpy"]
    assert req.runtime_env["config"] == {"setup_timeout_seconds": 120}
    assert req.env == {"A": "1", "B": "2"}  # (env_vars joined with env; raystack's own go on top at submit)


@pytest.mark.parametrize(
    ("renv", "says"),
    [
        ("{pipp: [x]}", "field 'runtime_env': unknown key 'pipp'; did you mean 'pip'?"),
        ("{pip: 5}", "runtime_env: runtime_env['pip'] must be of type str or List[str]"),
        ("{pip: [a], conda: env}", "runtime_env: The 'pip' field, 'uv' field, and 'conda' field"),
        ("{working_dir: ., env_vars: {RAYSTACK_X: '1'}}", "RAYSTACK_X is set by raystack itself"),
        ("{py_modules: [nope/]}", "runtime_env.py_modules: no file or folder 'nope/' (/"),
        ("{py_modules: [/no/mod]}", "runtime_env.py_modules: no file or folder '/no/mod'\n"),  # (once)
        ("{pip: missing.txt}", "runtime_env.pip: cannot read the requirements file"),
        ("{config: {setup_timeout_seconds: soon}}", "setup_timeout_seconds must be of type int"),
    ],
)
def test_a_bad_runtime_env_is_one_line_and_queues_nothing(
    capsys: pytest.CaptureFixture[str], renv: str, says: str
) -> None:
    Path("job.yaml").write_text(f"name: bad\nentrypoint: python x.py\nruntime_env: {renv}\n")
    code, _, err = run(capsys, "submit", "-c", "c4", "job.yaml")
    assert code == 1 and says in err and len(err.strip().splitlines()) == 1, err
    assert queue.waiting("c4") == []


def test_working_dir_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    Path("job.yaml").write_text("name: two\nentrypoint: x\nworking_dir: .\nruntime_env: {working_dir: .}\n")
    code, _, err = run(capsys, "submit", "-c", "c4", "job.yaml")
    assert code == 1 and "working_dir is given twice" in err


def test_a_fifo_in_py_modules_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    Path("lib").mkdir()
    os.mkfifo("lib/pipe")
    code, _, err = run(
        capsys, "submit", "-c", "c4", "--runtime-env-json", '{"py_modules": ["lib"]}', "--", "python", "x.py"
    )
    assert code == 1 and "pipe" in err and "FIFO" in err.upper(), err


def test_ray_job_submit_flags_mean_what_they_mean_there(capsys: pytest.CaptureFixture[str]) -> None:
    Path("src").mkdir()
    Path("env.yaml").write_text("env_vars: {LR: 1e-6}\nconfig: {eager_install: false}\n")
    [row] = submitted(
        capsys,
        "--working-dir", "src",
        "--entrypoint-num-cpus", "2", "--entrypoint-num-gpus", "0.5", "--entrypoint-memory", "4G",
        "--entrypoint-resources", '{"accelerator_type:H100": 1}',
        "--metadata-json", '{"team": "rl", "run": 7}',
        "--runtime-env", "env.yaml",
        "--runtime-env-json", '{"env_vars": {"SEED": "3"}}',
        "--submission-id", "my-run-1",
        "--no-wait",
        "--", "python", "train.py",
    )  # fmt: skip
    req = request("my-run-1")
    assert row["id"] == "my-run-1" and req.working_dir == str(Path("src").resolve())
    assert (req.entrypoint_num_cpus, req.entrypoint_num_gpus, req.entrypoint_memory) == (2, 0.5, 4 * 2**30)
    assert req.entrypoint_resources == {"accelerator_type:H100": 1} and req.metadata == {
        "team": "rl",
        "run": "7",
    }
    assert req.env == {"LR": "1e-6", "SEED": "3"} and req.runtime_env == {"config": {"eager_install": False}}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--submission-id", "../x"], "--submission-id: '../x' is not a job id"),
        (["--submission-id", "a" * 64], "is not a job id: it has 64 characters; at most 63"),
        (["--submission-id", "jöb"], "is not a job id: it holds 'ö': only ASCII letters, digits"),
        (["--name", "jöb"], "--name 'jöb' is not a job name: it holds 'ö': only ASCII letters"),
        (["--entrypoint-resources", "{nope"], "--entrypoint-resources: not JSON"),
        (["--metadata-json", "[1]"], "--metadata-json: give a JSON object"),
        (
            ["--after", "ghost-12345678"],
            "--after ghost-12345678: no job or sweep 'ghost-12345678' in cluster c4",
        ),
        (
            ["--after", "x:maybe"],
            "--after 'x:maybe': give a job or sweep id, optionally with :ok, :any or :notok",
        ),
        (["--sweep", "env.LR"], "--sweep 'env.LR': give KEY=V1,V2"),
        (["--sweep", 'env.A="x,1,2'], """--sweep 'env.A="x,1,2': a quote (") is not closed"""),
        (["--sweep", "nope.x=1,2"], "'nope' is not a field of the spec"),
    ],
)
def test_bad_flags_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    code, _, err = run(capsys, "submit", "-c", "c4", *argv, "--", "python", "x.py")
    assert code == 1 and says in err and len(err.strip().splitlines()) == 1, err
    assert queue.waiting("c4") == []


def test_a_taken_submission_id_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    submitted(capsys, "--submission-id", "once", "--", "true")
    code, _, err = run(capsys, "submit", "-c", "c4", "--submission-id", "once", "--", "true")
    assert code == 1 and "--submission-id once: cluster c4 has a job once" in err


def test_a_sweep_queues_every_combination_and_cancel_takes_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = submitted(
        capsys, "--sweep", "env.LR=1e-6,3e-6,1e-5", "--sweep", "env.SEED=1,2", "--", "python", "t.py"
    )
    ids = [r["id"] for r in rows]
    sweep = request(ids[0]).sweep
    assert len(ids) == 6 and ids == [f"{sweep}-{k}" for k in range(1, 7)] and sweep.startswith("t-")
    assert [r["position"] for r in rows] == [1, 2, 3, 4, 5, 6]  # (the queue in submission order)
    combos = {(request(i).env["LR"], request(i).env["SEED"]) for i in ids}
    assert combos == {(lr, s) for lr in ("1e-6", "3e-6", "1e-5") for s in ("1", "2")}
    assert request(ids[0]).sweep_values == {"env.LR": "1e-6", "env.SEED": "1"}
    code, out, err = run(capsys, "queue", "c4", "--json")
    assert code == 0 and {r["sweep"] for r in json.loads(out)} == {sweep}
    code, out, err = run(capsys, "queue", "c4")
    assert f"sweep {sweep}: 6 queued" in err
    code, out, _ = run(capsys, "cancel", sweep, "-c", "c4")
    assert code == 0 and f"sweep {sweep}: 6 job(s) cancelled" in out and queue.waiting("c4") == []
    code, out, _ = run(capsys, "cancel", sweep, "-c", "c4")  # again: nothing left to cancel
    assert code == 0 and f"sweep {sweep}: 0 job(s) cancelled, 6 had ended" in out


def test_a_spec_sweep_block_keeps_values_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    Path("s.yaml").write_text("name: s\nentrypoint: x\nsweep: {env.LR: [1e-6, 3.0e-6], retries: [0, 2]}\n")
    rows = submitted(capsys, "s.yaml")
    values = sorted((request(r["id"]).env["LR"], request(r["id"]).retries) for r in rows)
    assert values == [("1e-6", 0), ("1e-6", 2), ("3.0e-6", 0), ("3.0e-6", 2)]


def test_a_sweep_value_given_twice_queues_the_replicas_and_says_so(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    Path("s.yaml").write_text("name: s\nentrypoint: x\nsweep: {env.SEED: [1, 2, 1]}\n")
    code, out, _ = run(capsys, "submit", "-c", "c4", "s.yaml", "--json")
    assert code == 0 and len(json.loads(out)) == 3 and len(queue.waiting("c4")) == 3
    said = "raystack: warning: sweep env.SEED: '1' is given more than once: those jobs run alike"
    assert said in caplog.text, caplog.text  # (on stderr outside pytest, which takes the log)


def test_dependencies_name_existing_jobs_or_sweeps(capsys: pytest.CaptureFixture[str]) -> None:
    [train] = submitted(capsys, "--", "python", "train.py")
    sweep_rows = submitted(capsys, "--sweep", "env.X=1,2", "--", "python", "eval.py")
    sweep = request(sweep_rows[0]["id"]).sweep
    [after] = submitted(
        capsys, "--after", train["id"], "--after", f"{sweep}:any", "--", "python", "report.py"
    )
    assert request(after["id"]).after == [train["id"], f"{sweep}:any"]
    code, _, err = run(capsys, "submit", "-c", "c4", "--submission-id", "me", "--after", "me", "--", "x")
    assert code == 1 and "a job cannot wait for itself" in err


def test_a_dependency_that_can_never_be_met_is_refused_at_submit(capsys: pytest.CaptureFixture[str]) -> None:
    """afterok on a job that has FAILED (or a sweep one of whose jobs did) would be queued only to
    be cancelled: refused with the fix, nothing queued; :any and :notok are taken."""
    [train] = submitted(capsys, "--", "python", "train.py")
    rows = submitted(capsys, "--sweep", "env.X=1,2", "--", "python", "eval.py")
    update_job("c4", train["id"], state=JobState.FAILED)
    update_job("c4", rows[1]["id"], state=JobState.FAILED)
    before = len(queue.waiting("c4"))
    sweep = request(rows[0]["id"]).sweep
    for given in (train["id"], sweep):
        code, _, err = run(capsys, "submit", "-c", "c4", "--after", given, "--", "python", "x.py")
        failed = train["id"] if given == train["id"] else rows[1]["id"]
        said = f"--after {given}: dependency {failed} ended FAILED: afterok:{given} can never be met; "
        assert code == 1 and said + f"give {given}:any to run after it however it ended" in err, err
    code, _, err = run(capsys, "submit", "-c", "c4", "--after", f"{train['id']}:any", "--", "python", "x.py")
    assert code == 0, err
    code, _, err = run(
        capsys, "submit", "-c", "c4", "--after", f"{train['id']}:notok", "--", "python", "x.py"
    )
    assert code == 0, err
    assert len(queue.waiting("c4")) == before + 2


def test_a_packed_job_plans_its_layout_on_its_own_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    Path("g.yaml").write_text(
        "name: g\nentrypoint: python grpo_fast.py {plan.flags}\nneeds: {nodes: 2}\n"
        "plan: {kind: grpo, learners: 4, tp: 1, cpus_per_learner_gpu: 4}\n"
    )
    [row] = submitted(capsys, "g.yaml")
    planned = request(row["id"]).planned
    assert "--num_learners_per_node 2 2 " in planned and "--vllm_num_engines 4" in planned, planned


def test_after_a_name_is_answered_with_its_ids(capsys: pytest.CaptureFixture[str]) -> None:
    """`raystack queue` shows names (sw [env.LR=1e-6]); --after takes ids: the ids of that name."""
    sweep = request(submitted(capsys, "--sweep", "env.LR=1,2", "--", "python", "sw.py")[0]["id"]).sweep
    job = submitted(capsys, "--", "python", "sw.py")[0]["id"]
    code, _, err = run(capsys, "submit", "-c", "c4", "--after", "sw", "--", "python", "x.py")
    assert code == 1 and "no job or sweep 'sw' in cluster c4; sw is a name, its ids: " in err, err
    assert sorted(err.split("its ids: ")[1].split(" (see")[0].split(", ")) == sorted([sweep, job]), err


def test_stop_of_a_queued_sweep_cancels_it_and_says_so_once_ended(capsys: pytest.CaptureFixture[str]) -> None:
    sweep = request(submitted(capsys, "--sweep", "env.LR=1,2", "--", "python", "t.py")[0]["id"]).sweep
    code, out, err = run(capsys, "stop", str(sweep))  # (stop: the same as cancel)
    assert code == 0 and f"sweep {sweep}: 2 job(s) cancelled" in out, out + err
    assert out.count("CANCELLED (cancelled before it started)") == 2 and queue.waiting("c4") == []
    code, out, _ = run(capsys, "cancel", str(sweep))
    assert code == 0 and f"sweep {sweep}: 0 job(s) cancelled, 2 had ended" in out, out


def test_after_a_job_of_another_cluster_says_where_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `no job ... in cluster c4 (see raystack queue --all)`, though the user had just
    seen the id in the other cluster's queue."""
    code, out, err = run(capsys, "submit", "-c", "other", "--json", "--", "python", "train.py")
    train = json.loads(out)["id"]
    code, _, err = run(capsys, "submit", "-c", "c4", "--after", train, "--", "python", "eval.py")
    assert code == 1 and err.strip() == (
        f"raystack: error: --after {train}: no job or sweep '{train}' in cluster c4: it is in cluster "
        "other, and a job waits only for jobs of its own cluster"
    ), err
    assert queue.view("c4").records == []


def test_a_job_asked_of_the_wrong_cluster_or_cancelled_once_ended_is_told_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `logs ID -c c4` of a job of cluster other said only "no job ... in cluster c4", and
    `cancel` of an ended job told to `raystack stop` it, as if it ran."""
    code, out, err = run(capsys, "submit", "-c", "other", "--json", "--", "python", "train.py")
    job = json.loads(out)["id"]
    code, _, err = run(capsys, "logs", job, "-c", "c4")
    assert code == 1 and err.strip() == (
        f"raystack: error: no job '{job}' in cluster c4: it is in cluster other (-c other)"
    ), err
    assert run(capsys, "cancel", job, "-c", "other")[0] == 0
    code, _, err = run(capsys, "cancel", job, "-c", "other")
    assert code == 1 and err.strip() == f"raystack: error: job {job} has ended (CANCELLED): nothing to cancel"
