"""Job specs: parsing, --set overrides, resolution, and the catalogue of bad input.

Every bad spec gives one line naming the file, the field and the fix, and queues nothing. These
checks happen before anything reaches SLURM or Ray, so the cluster here is a record in a private
RAYSTACK_HOME (a 4-node x 4-GPU x 16-CPU cluster still starting); the same errors against a live
cluster are covered in test_queue.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raystack.allocation.runner.drain import gpu_memory_held
from raystack.errors import ConfigError
from raystack.spec import submission as jobs
from raystack.spec import workdir
from raystack.spec.job import JobSpec, apply_sets
from raystack.spec.load import command_spec, load_spec
from raystack.spec.resolve import resolve, resumed_spec
from raystack.spec.values import parse_duration
from raystack.spec.workdir import DEFAULT_EXCLUDES
from raystack.store import cluster as clusters
from raystack.store import ledger, node_entries, queue
from raystack.store.cluster import ClusterRecord, ClusterState

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c4")
    clusters.write(
        ClusterRecord(
            name="c4",
            state=ClusterState.STARTING,
            nodes_expected=4,
            gpus_per_node=4,
            cpus_per_node=16,
            walltime_end=2_000_000_000,
        )
    )
    return tmp_path


def submit(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raystack.cli", "submit", "--cluster", "c4", *args],
        capture_output=True,
        text=True,
        cwd=home,
        env=dict(os.environ),
        timeout=60,
    )


def write(home: Path, text: str, name: str = "job.yaml") -> str:
    (home / name).write_text(text)
    return str(home / name)


GOOD = "name: t\nentrypoint: python t.py\n"


def test_good_spec_is_queued_with_conventions(home: Path) -> None:
    (home / "src").mkdir()
    (home / "src" / "t.py").write_text("print(1)\n")
    path = write(
        home,
        GOOD + "working_dir: src\nenv: {LR: '1e-6'}\noutputs: {ckpt: out/ckpt}\n"
        "needs: {nodes: 4, gpus: 16, gpus_per_node: 4, cpus_per_gpu: 4}\ntimeout: 2h\nstop_grace: 5s\n",
    )
    done = submit(home, path, "--set", "env.LR=3e-6", "--json")
    assert done.returncode == 0, done.stderr
    [record] = ledger.all_jobs("c4")
    req = record.request
    assert record.state.value == "QUEUED" and len(queue.waiting("c4")) == 1
    assert req.working_dir == str(home / "src") and req.env == {"LR": "3e-6"}
    assert req.outputs == {"ckpt": str(home / "out" / "ckpt")} and req.timeout == 7200 and req.stop_grace == 5
    assert set(DEFAULT_EXCLUDES) <= set(req.excludes)
    env = jobs.job_env(req, clusters.read("c4"))
    assert env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1" and env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0"
    assert env["RAYSTACK_DEADLINE"] == "2000000000" and env["RAYSTACK_CLUSTER"] == "c4"
    assert (
        env["RAYSTACK_OUTPUT_CKPT"] == str(home / "out" / "ckpt") and env["RAY_JOB_STOP_WAIT_TIME_S"] == "5"
    )
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_bare_command_is_taken_verbatim(home: Path) -> None:
    done = submit(home, "--", "python", "train.py", "--lr", "1e-6", "--name", "a b")
    assert done.returncode == 0, done.stderr
    [record] = ledger.all_jobs("c4")
    assert record.request.entrypoint == "python train.py --lr 1e-6 --name 'a b'"
    assert record.name == "train"


def test_a_job_without_a_working_dir_runs_in_the_folder_it_was_submitted_from(home: Path) -> None:
    """As sbatch does: the driver's shell enters the submit folder (its ranks: RAYSTACK_SUBMIT_DIR);
    with a working_dir Ray runs it in its copy, so nothing changes folder; a folder this node
    lacks: the shell's error, and the job goes on where it is."""
    where = home / "it's a folder"
    where.mkdir()
    assert (
        subprocess.run(
            [sys.executable, "-m", "raystack.cli", "submit", "-c", "c4", "--", "pwd"],
            cwd=where,
            capture_output=True,
            text=True,
            env=dict(os.environ),
            timeout=60,
        ).returncode
        == 0
    )
    (home / "src").mkdir()
    assert submit(home, "--working-dir", "src", "--", "pwd").returncode == 0
    plain, shipped = (r.request for r in ledger.all_jobs("c4"))
    assert plain.submit_dir == str(where) and shipped.submit_dir == str(home) and shipped.working_dir
    cluster = clusters.read("c4")
    entry = jobs.submit_options(plain, cluster)["entrypoint"]
    ran = subprocess.run(["sh", "-c", entry], cwd="/", capture_output=True, text=True)
    assert ran.stdout.strip() == str(where) and not ran.stderr, ran
    assert jobs.job_env(plain, cluster)["RAYSTACK_SUBMIT_DIR"] == str(where)
    assert "cd " not in jobs.submit_options(shipped, cluster)["entrypoint"]
    assert "RAYSTACK_SUBMIT_DIR" not in jobs.job_env(shipped, cluster)
    where.rmdir()
    ran = subprocess.run(["sh", "-c", entry], cwd="/", capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip() == "/", ran
    assert str(where) in ran.stderr and "raystack: warning: the job runs in / instead" in ran.stderr, (
        ran.stderr
    )


def test_queue_positions_follow_submission_order(home: Path) -> None:
    for _ in range(3):
        assert submit(home, "--", "true").returncode == 0
    ids = [r.id for r in ledger.all_jobs("c4")]
    assert [queue.position("c4", i) for i in ids] == [1, 2, 3]
    queue.cancel("c4", ids[1])
    assert [queue.position("c4", i) for i in ids] == [1, 0, 2]


def test_uv_opt_in() -> None:
    spec = JobSpec(name="u", entrypoint="x", uv=True)
    req = ledger.JobRequest(id="u-1", name="u", cluster="c", entrypoint="x", uv=spec.uv)
    assert jobs.job_env(req, ClusterRecord(name="c"))["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "1"


def test_every_job_gets_torchs_own_hang_evidence_unless_the_user_set_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flight recorder on, dumped on NCCL's timeout into the job's folder and on raystack's ask
    through a pipe in the node's /tmp (torch 2.11 and 2.13 read these names); what the user set, in
    the spec or in the cluster's environment, under either of torch's names, stays theirs."""
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    req = ledger.JobRequest(id="t-1", name="t", cluster="c", entrypoint="x", hang_timeout=90)
    env = jobs.job_env(req, ClusterRecord(name="c"))
    flight = tmp_path / "clusters" / "c" / "logs" / "jobs" / "t-1" / "flight"
    assert {k: v for k, v in env.items() if k.startswith("TORCH_")} == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": f"{flight}/rank_",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/raystack-fr-t-1-rank",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "90",
    }
    mine = req.model_copy(update={"env": {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, "hang_timeout": None})
    env = jobs.torch_env(mine, "c", inherited={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    assert "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env
    assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" not in env  # (no hang_timeout: torch's own default)
    assert jobs.job_env(mine, ClusterRecord(name="c"))["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 5400),  # a bare number is minutes, as in SLURM's --time
        ("90", 5400),
        (0.5, 30),
        ("90s", 90),
        ("15m", 900),
        ("2h30m", 9000),
        ("1.5h", 5400),
        ("2 hours", 7200),
        ("1d", 86400),
        ("30:00", 1800),  # M:S
        ("01:00:05", 3605),  # H:M:S
        ("1-2", 93600),  # D-H
        ("1-2:30", 95400),  # D-H:M
        ("1-00:00:00", 86400),  # D-H:M:S
    ],
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "off"),
    [
        ("timeout", None),
        ("min_time", None),
        ("hang_timeout", 0.0),
        ("retry_window", 0.0),
        ("infeasible_grace", 0.0),
    ],
)
@pytest.mark.parametrize("value", [0, "0", "off", "none", "never"])
def test_zero_means_off_for_every_duration_of_a_spec(field: str, off: float | None, value: object) -> None:
    spec = JobSpec.model_validate({"name": "z", "entrypoint": "x", field: value})
    assert getattr(spec, field) == off


def test_set_types_values_as_yaml() -> None:
    data = apply_sets({"name": "a", "entrypoint": "x"}, ["needs.gpus=8", "env.FLAG=true", "retries=2"])
    assert data["needs"] == {"gpus": 8} and data["env"] == {"FLAG": "true"} and data["retries"] == 2
    assert load_spec(REPO / "jobs" / "debug" / "hello.yaml", ["name=hi"]).name == "hi"


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["python", "x/train.py", "--lr", "1"], "train"),
        (["python3", "-m", "open_instruct.grpo_fast"], "grpo_fast"),
        (["python", "-c", "print(1)"], "python"),
        (["./run.sh"], "run.sh"),
        (["torchrun", "--nproc-per-node=4", "train.py"], "torchrun"),
        (["...", "x"], "job"),
    ],
)
def test_command_spec_name(argv: list[str], name: str) -> None:
    assert command_spec(argv).name == name


def test_python_first_is_kept_where_the_launcher_is_told_not_to_add_it() -> None:
    spec = command_spec(["python", "t.py"], sets=["launcher=torchrun", 'launcher_args=["--no-python"]'])
    assert spec.command == "python t.py"


def test_command_spec_with_a_launcher_becomes_spmd() -> None:
    spec = command_spec(["train.py", "--lr", "1"], sets=["launcher=torchrun", "nodes=2"])
    assert (spec.kind, spec.command, spec.nodes) == ("spmd", "train.py --lr 1", 2)
    assert spec.entrypoint.startswith("python -m raystack.launch.spmd --launcher=torchrun --nodes=2 ")
    assert spec.entrypoint.endswith(" -- train.py --lr 1")


def test_debug_specs_load() -> None:
    for name in ("hello", "allreduce", "zero3", "resume"):
        assert load_spec(REPO / "jobs" / "debug" / f"{name}.yaml").name == name


BAD = [
    # (spec text, extra args, expected message)
    ("name: t\n", [], r"missing field 'entrypoint'; add it"),
    ("name: t\ncommand: python x.py\n", [], r"command and launcher are for kind: spmd; add kind: spmd"),
    (
        "name: t\nentrypoint: x\noutputs: [ckpt]\n",
        [],
        r"field 'outputs': must map names to folders, e.g. outputs:",
    ),
    ("name: t\nentrypoint: x\noutputs: ckpt\n", [], r"field 'outputs': must map names to folders"),
    (
        "name: t\nentrypoint: [python, train.py, --lr, 1e-6]\n",
        [],
        r"field 'entrypoint': is a list; give the command as one line: python train.py --lr 1e-6",
    ),
    (
        "name: t\nkind: spmd\nlauncher: torchrun\ncommand: [train.py, 'my arg']\n",
        [],
        r"field 'command': is a list; give the command as one line: train.py 'my arg'",
    ),
    (
        "name: t\nkind: spmd\nlauncher: torchrun\ncommand: python train.py --lr 1\n",
        [],
        r"command starts with python: torchrun starts Python itself; drop it: command: train.py --lr 1$",
    ),
    (
        "name: t\nkind: spmd\nlauncher: deepspeed\ncommand: python3 -m pkg.train\n",
        [],
        r"drop it: command: pkg.train with launcher_args: \[--module\]",
    ),
    (
        "name: t\nkind: spmd\nlauncher: torchrun\ncommand: torchrun --nproc_per_node 4 train.py\n",
        [],
        r"command starts with torchrun: raystack runs torchrun itself on every node; give the script",
    ),
    (
        "name: t\nkind: spmd\nlauncher: torchrun\ncommand: python -m torch.distributed.run t.py\n",
        [],
        r"command starts with python -m torch.distributed.run: raystack runs torchrun itself",
    ),
    (
        "name: t\nkind: spmd\nlauncher: accelerate\nlauncher_args: [--num_processes, '8']\ncommand: t.py\n",
        [],
        r"launcher_args: --num_processes is set by raystack on accelerate's command line \(give "
        r"procs_per_node: N instead\); drop it",
    ),
    (
        "name: t\nkind: spmd\nlauncher: torchrun\nlauncher_args: [--master_port=1]\ncommand: t.py\n",
        [],
        r"--master_port is set by raystack on torchrun's command line \(raystack makes the rendezvous",
    ),
    ("name: t\nentrypoint: x\nretries: yes\n", [], r"field 'retries': true is a yes/no \(YAML reads"),
    ("name: t\nentrypoint: x\nneeds: {gpus: on}\n", [], r"field 'needs.gpus': true is a yes/no"),
    ("name: t\nentrypoint: x\ntimeout: yes\n", [], r"field 'timeout': true is a yes/no, not a duration"),
    (
        "name: " + "a" * 300 + "\nentrypoint: x\n",
        [],
        r"'a+\.\.\. is not a job name: it has 300 characters; at most 63",
    ),
    (GOOD + "entrypint: x\n", [], r"unknown key 'entrypint' \(did you mean 'entrypoint'\?\); valid keys: "),
    ("name: t\nentrypint: x\n", [], r"unknown key 'entrypint' \(did you mean 'entrypoint'\?\)"),
    (
        GOOD + "entrypoint_num_gpus: lots\n",
        [],
        r"field 'entrypoint_num_gpus': .*valid number.* \(got 'lots'\)",
    ),
    (GOOD + "entrypoint_num_gpus: -1\n", [], r"field 'entrypoint_num_gpus': .*greater than or equal to 0"),
    (GOOD + "needs: {gpus: -2}\n", [], r"field 'needs.gpus'"),
    (GOOD + "needs: {gpus: 32}\n", [], r"needs.gpus=32 but cluster 'c4' has 4 nodes x 4 GPUs = 16; lower it"),
    (GOOD + "needs: {nodes: 5}\n", [], r"needs.nodes=5 but cluster 'c4' has 4 nodes"),
    (GOOD + "needs: {gpus_per_node: 8}\n", [], r"needs.gpus_per_node=8 but cluster 'c4'"),
    (
        GOOD + "needs: {cpus_per_gpu: 10}\n",
        [],
        r"needs.cpus_per_gpu=10 asks 40 CPUs per node but cluster 'c4' has 16",
    ),
    (
        GOOD + "needs: {gpu: 1}\n",
        [],
        r"unknown key 'needs.gpu' \(did you mean 'gpus'\?\); valid keys: cpus, cpus_per_gpu, gpus, "
        r"gpus_per_node, nodes",
    ),
    (
        GOOD + "entrypoint_num_gpus: 8\n",
        [],
        r"entrypoint_num_gpus=8 but the driver runs on one node and cluster 'c4' has 4 GPUs per node",
    ),
    (
        GOOD + "working_dir: nowhere\n",
        [],
        r"working_dir 'nowhere' is not a folder \(/\S+/nowhere: relative paths start at /\S+\); fix the path",
    ),
    (GOOD + "working_dir: /no/where\n", [], r"working_dir '/no/where' is not a folder; fix the path$"),
    (GOOD + "working_dir: ~/no/where\n", [], r"working_dir '~/no/where' is not a folder \(/\S+/no/where\); "),
    (GOOD + "env: {CUDA_VISIBLE_DEVICES: '0'}\n", [], r"never set CUDA_VISIBLE_DEVICES"),
    (GOOD + "env: {'1BAD': x}\n", [], r"'1BAD' is not an environment variable name"),
    (GOOD + "timeout: forever\n", [], r"field 'timeout': 'forever' is not a duration"),
    (GOOD + "retries: -1\n", [], r"field 'retries'"),
    (GOOD + "stop_grace: soon\n", [], r"field 'stop_grace'"),
    (GOOD + "outputs: {'my-dir': x}\n", [], r"field 'outputs': 'my-dir' must be usable in RAYSTACK_OUTPUT_"),
    ("name: 'bad name'\nentrypoint: x\n", [], r"field 'name': 'bad name' is not a job name"),
    ("name: t\nentrypoint: '  '\n", [], r"field 'entrypoint': is empty"),
    ("- a\n- b\n", [], r"must be a mapping"),
    ("name: [unclosed\n", [], r"not valid YAML .*: fix it$"),
    # the two YAML mistakes people make most get their fix (they used to get "fix it")
    (
        "name: t\nentrypoint: python -c 'f = lambda: 1'\n",
        [],
        r"mapping values are not allowed here at line 2\): a value holding ': ' .* must be quoted",
    ),
    ("name: t\nentrypoint: x\nenv:\n  A: '1'\n\tB: '2'\n", [], r"at line 5\): indent with spaces, not tabs$"),
    (GOOD, ["--set", "nedds.gpus=1"], r"--set 'nedds.gpus=1': 'nedds' is not a field of the spec; valid: "),
    (GOOD, ["--set", "needs.gpu=1"], r"'gpu' is not a field of needs; valid: cpus, cpus_per_gpu, gpus"),
    (GOOD, ["--set", "needs"], r"--set 'needs': use --set key.sub=value"),
    # keys from other tools: where raystack takes what they mean, not a guessed spelling
    (GOOD + "resources: {gpus: 2}\n", [], r"unknown key 'resources' \(a job's GPUs.* go under needs: "),
    (GOOD + "env_vars: {A: '1'}\n", [], r"unknown key 'env_vars' \(raystack calls it env\)"),
    # ... and a typo of one (493426b: 'enviroment' listed the valid keys without a hint)
    (GOOD + "enviroment: {A: '1'}\n", [], r"unknown key 'enviroment' \(raystack calls it env\)"),
    (GOOD, ["--set", "enviroment.A=1"], r"'enviroment' is not a field of the spec \(raystack calls it env\)"),
    (GOOD + "dependson: [a]\n", [], r"'dependson' \(raystack calls it after: \[JOB_ID"),
    (GOOD + "pip: [numpy]\n", [], r"'pip' \(Ray's runtime_env keys go under runtime_env: \(runtime_env.pip"),
    (GOOD + "depends_on: [a]\n", [], r"'depends_on' \(raystack calls it after: \[JOB_ID"),
    (
        GOOD + "walltime: 2h\n",
        [],
        r"'walltime' \(timeout: stops the job after a duration; .*raystack up --time",
    ),
    (GOOD, ["--set", "resources.gpus=2"], r"'resources' is not a field of the spec \(a job's GPUs"),
    (GOOD, ["--set", "name.x=1"], r"'name' is not a mapping"),
    # What first real use and a code review found (each used to be a traceback, a hang or silence).
    (GOOD + "env: {A: [1, 2]}\n", [], r"field 'env': A is a list; environment values are strings"),
    (GOOD + "env: {A: {b: 1}}\n", [], r"A is a mapping"),
    (GOOD + "stop_grace: .inf\n", [], r"field 'stop_grace': inf is not a duration"),
    (GOOD + "timeout: .nan\n", [], r"field 'timeout': nan is not a duration"),
    (GOOD + "stop_grace: 0\n", [], r"field 'stop_grace': 0 is no time at all"),
    (GOOD + "stop_grace: 0.5s\n", [], r"field 'stop_grace': '0.5s' is less than"),
    (GOOD + "hang_timeout: 2x\n", [], r"field 'hang_timeout': '2x' is not a duration; use minutes"),
    (GOOD + "timeout: 100000d\n", [], r"'timeout': '100000d' is over the limit of 365d; give less, e.g. 30d"),
    (GOOD + "name: x\n", [], r"not valid YAML \(duplicate key 'name' at line 3\)"),
    (GOOD + "outputs: {ckpt: a, CKPT: b}\n", [], r"'ckpt' and 'CKPT' would both be RAYSTACK_OUTPUT_CKPT"),
    (GOOD + "env: {RAYSTACK_JOB_ID: x}\n", [], r"RAYSTACK_JOB_ID is set by raystack itself"),
    (
        GOOD + "env: {RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: '1'}\n",
        [],
        r"never set RAY_EXPERIMENTAL_NOSET",
    ),
    ('name: "ok\\n"\nentrypoint: x\n', [], r"field 'name': 'ok\\n' is not a job name"),
    (GOOD + 'env: {"A\\n": x}\n', [], r"'A\\n' is not an environment variable name"),
    (
        "name: t\nentrypoint: '" + "x" * 140_000 + "'\n",
        [],
        r"field 'entrypoint': is 140,\d+ bytes; the kernel",
    ),
    (GOOD, ["--set", "stop_grace=.inf"], r"stop_grace': inf is not a duration"),
    (GOOD, ["--set", "env.X\nY=1"], r"'X\\nY' is not an environment variable name"),
]


@pytest.mark.parametrize(("text", "extra", "message"), BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_spec_is_one_line_and_queues_nothing(
    home: Path, text: str, extra: list[str], message: str
) -> None:
    path = write(home, text)
    done = submit(home, path, *extra)
    assert done.returncode == 1, done.stdout
    line = done.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith("raystack: error: ")
    pytest.importorskip("re").search(message, line) or pytest.fail(f"{message!r} not in {line!r}")
    if "--set" not in extra[:1] and "mapping" not in message and "YAML" not in message:
        assert "job.yaml" in line  # names the file
    assert queue.waiting("c4") == [] and ledger.all_jobs("c4") == []


def test_missing_spec_file(home: Path) -> None:
    done = submit(home, str(home / "nope.yaml"))
    assert done.returncode == 1 and "nope.yaml' (no such file)" in done.stderr
    assert not list((home / "clusters" / "c4" / "queue").glob("*")), "nothing may be queued"


def test_working_dir_over_the_upload_limit_names_the_biggest_folders(home: Path) -> None:
    repo = home / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "train.py").write_text("print(1)\n")
    with open(repo / "data" / "shard.dat", "wb") as fh:  # sparse: costs no disk
        fh.truncate(workdir.UPLOAD_LIMIT + 1)
    path = write(home, GOOD + "working_dir: repo\n")
    done = submit(home, path)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert "\n" not in line and "over 100 MiB to upload" in line, line
    assert "biggest: data/ (100 MiB)" in line and "--set 'excludes=[data/]'" in line, line  # (not src/: tiny)
    assert ledger.all_jobs("c4") == []
    # The fix it names works.
    assert submit(home, path, "--set", "excludes=[data/]").returncode == 0


def test_working_dir_that_is_a_real_repository(home: Path) -> None:
    """A .gitignore (nested too) and a .rayignore: what first real use crashed on."""
    repo = home / "repo"
    (repo / "pkg" / "cache").mkdir(parents=True)
    (repo / ".git" / "objects").mkdir(parents=True)
    (repo / ".gitignore").write_text("*.log\n/big/\n")
    (repo / ".rayignore").write_text("scratch/\n")
    (repo / "pkg" / ".gitignore").write_text("cache/\n")
    (repo / "big").mkdir()
    for folder in ("big", "pkg/cache", ".git/objects"):
        with open(repo / folder / "blob", "wb") as fh:
            fh.truncate(workdir.UPLOAD_LIMIT + 1)
    (repo / "pkg" / "mod.py").write_text("x = 1\n")
    path = write(home, GOOD + "working_dir: repo\n")
    done = submit(home, path)
    assert done.returncode == 0, done.stderr
    up = workdir.scan(repo, [])
    assert sorted(up.files) == [".gitignore", ".rayignore", "pkg/.gitignore", "pkg/mod.py"]


def test_symlink_loop_is_refused_and_the_walk_ends(home: Path) -> None:
    repo = home / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("")
    (repo / "loop1").symlink_to(".")
    (repo / "loop2").symlink_to(repo)
    done = submit(home, write(home, GOOD + "working_dir: repo\n"))
    assert done.returncode == 1 and "is a symlink loop" in done.stderr and "excludes" in done.stderr


def test_huge_working_dir_stops_early(home: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"holds over 100 MiB to upload"):
        workdir.check(Path("/usr"), [], "job spec x")
    assert time.monotonic() - t0 < 20


def test_upload_matches_rays_own_packager(tmp_path: Path) -> None:
    """Pins the walk to what Ray 2.60 really zips: the same files, or this test fails."""
    from zipfile import ZipFile

    from ray._private.runtime_env.packaging import create_package

    root = tmp_path / "wd"
    for rel in [
        "a.py",
        "b.log",
        "keep/c.txt",
        "keep/d.tmp",
        "deep/x/y.bin",
        "deep/x/z.py",
        "data/big.csv",
        "pkg/__pycache__/m.pyc",
        "pkg/m.py",
        ".venv/lib/x.py",
        "docs/readme.md",
        "docs/_build/i.html",
    ]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text("*.log\n/data/\n")
    (root / "deep" / ".gitignore").write_text("*.bin\n")
    (root / "docs" / ".rayignore").write_text("_build/\n")
    (root / "linked").symlink_to(root / "keep")
    excludes = ["*.tmp", "pkg/m.py", *DEFAULT_EXCLUDES]
    zipped = tmp_path / "pkg.zip"
    from raystack.spec.workdir import ray_default_excludes

    create_package(str(root), zipped, include_gitignore=True, excludes=[*ray_default_excludes(), *excludes])
    with ZipFile(zipped) as zf:
        ray_files = sorted(n for n in zf.namelist() if not n.endswith("/"))
    assert sorted(workdir.scan(root, excludes).files) == ray_files


def test_stopped_cluster_refuses_jobs(home: Path) -> None:
    clusters.update("c4", state=ClusterState.STOPPED)
    done = submit(home, "--", "true")
    assert done.returncode == 1 and "cluster c4 is STOPPED: start it again" in done.stderr


def test_resolve_is_pure_and_checks_before_writing(home: Path) -> None:
    spec = JobSpec(name="x", entrypoint="true", needs={"gpus": 17})  # type: ignore[arg-type]
    before = sorted((p, p.stat().st_mtime_ns) for p in home.rglob("*"))
    with pytest.raises(ConfigError, match=r"needs\.gpus=17"):
        resolve(spec, clusters.read("c4"), home, "job spec x")
    resolve(
        spec.model_copy(update={"needs": spec.needs.model_copy(update={"gpus": 4})}),
        clusters.read("c4"),
        home,
        "x",
    )
    assert sorted((p, p.stat().st_mtime_ns) for p in home.rglob("*")) == before  # nothing written


def test_gpu_drain_needs_a_report_newer_than_the_job_end(home: Path) -> None:
    """The queue waits for leftover GPU memory; a report from before the job ended proves nothing."""
    end = 1000.0
    node_entries.write_node_entry("c4", "node1", {"ip": "x"})  # no nvidia-smi there: not a GPU node
    assert gpu_memory_held("c4", since=end) == []
    node_entries.write_node_entry("c4", "node2", {"gpu_checked": end - 1, "gpu_procs": [[42, 4110]]})
    assert gpu_memory_held("c4", since=end, now=end + 60) is None  # held before the end: wait
    node_entries.write_node_entry("c4", "node2", {"gpu_checked": end - 1, "gpu_procs": []})
    assert gpu_memory_held("c4", since=end, now=end + 1) is None  # a change may not be reported yet
    assert gpu_memory_held("c4", since=end, now=end + 5) == []  # written on change: none since
    assert gpu_memory_held("c4", since=end, now=end + 120) is None  # that node stopped reporting
    node_entries.write_node_entry("c4", "node2", {"gpu_checked": end + 1, "gpu_procs": [[42, 4110]]})
    assert gpu_memory_held("c4", since=end) == ["node2 pid 42 (4110 MiB)"]
    node_entries.write_node_entry("c4", "node2", {"gpu_checked": end + 2, "gpu_procs": []})
    assert gpu_memory_held("c4", since=end) == []


def test_a_node_that_asks_its_gpus_through_nvml_settles_sooner(home: Path) -> None:
    """A node checking every 0.25 s (NVML) has seen a change 0.5 s after the end; one asking
    nvidia-smi every second (or one from before gpu_every was written) only after 2 s."""
    end = 1000.0
    node_entries.write_node_entry("c4", "fast", {"gpu_checked": end - 9, "gpu_procs": [], "gpu_every": 0.25})
    assert gpu_memory_held("c4", since=end, now=end + 0.4) is None
    assert gpu_memory_held("c4", since=end, now=end + 0.6) == []
    node_entries.write_node_entry("c4", "slow", {"gpu_checked": end - 9, "gpu_procs": []})
    assert gpu_memory_held("c4", since=end, now=end + 0.6) is None
    assert gpu_memory_held("c4", since=end, now=end + 2.1) == []


def test_the_runners_own_node_is_asked_now_and_needs_no_settling(home: Path) -> None:
    """The queue runner asks the head's GPUs itself (NVML): that node's answer counts at once,
    the other nodes still settle on their reports."""
    end = 1000.0
    node_entries.write_node_entry(
        "c4", "head", {"pid": 77, "gpu_checked": end - 9, "gpu_procs": [], "gpu_every": 0.25}
    )
    assert gpu_memory_held("c4", since=end, now=end + 0.01) is None  # its report: wait
    assert gpu_memory_held("c4", since=end, now=end + 0.01, here=(77, [])) == []
    assert gpu_memory_held("c4", since=end, now=end + 0.01, here=(77, [(9, 500)])) == ["head pid 9 (500 MiB)"]
    assert gpu_memory_held("c4", since=end, now=end + 0.01, here=(78, [])) is None  # another node's program
    node_entries.write_node_entry(
        "c4", "w1", {"pid": 5, "gpu_checked": end - 9, "gpu_procs": [], "gpu_every": 0.25}
    )
    assert gpu_memory_held("c4", since=end, now=end + 0.01, here=(77, [])) is None  # w1 settles
    assert gpu_memory_held("c4", since=end, now=end + 0.6, here=(77, [])) == []


def test_numbers_in_env_stay_as_written(home: Path) -> None:
    path = write(home, GOOD + "env: {SEED: 42, LR: 1.0e-6, FLAG: true, EMPTY: , QUOTED: '007'}\n")
    spec = load_spec(path, ["env.LR2=1e-6", "env.N=3", "env.X=1"])
    assert spec.env == {
        "SEED": "42",
        "LR": "1.0e-6",
        "FLAG": "true",
        "EMPTY": "",
        "QUOTED": "007",
        "LR2": "1e-6",
        "N": "3",
        "X": "1",
    }
    done = submit(home, "--set", "env.SEED=42", "--set", "env.LR=1e-6", "--", "true")
    assert done.returncode == 0, done.stderr
    assert ledger.all_jobs("c4")[-1].request.env == {"SEED": "42", "LR": "1e-6"}


def test_resume_env_stays_as_written(home: Path) -> None:
    """resume.env is an env like the spec's own: 010 is not 8, yes is not true."""
    path = write(home, GOOD + "resume: {env: {STEP: 010, FLAG: yes, LR: 1.0e-6, NONE: }}\n")
    spec = load_spec(path, ["resume.env.SEED=0x10"])
    assert spec.resume.env == {"STEP": "010", "FLAG": "yes", "LR": "1.0e-6", "NONE": "", "SEED": "0x10"}
    resumed = resumed_spec(spec, str(path))
    assert resumed is not None and resumed.env["STEP"] == "010" and resumed.env["FLAG"] == "yes"


def test_a_bad_key_in_resume_set_names_resume_set_not_the_set_flag(home: Path) -> None:
    spec = load_spec(write(home, GOOD + "resume: {set: [lr=1]}\n"), [])
    with pytest.raises(ConfigError, match=r"^job spec x: field 'resume.set': 'lr=1': 'lr' is not a field"):
        resumed_spec(spec, "job spec x")


def test_non_utf8_spec_is_one_line(home: Path) -> None:
    path = home / "job.yaml"
    path.write_bytes(b"name: t\nentrypoint: caf\xe9\n")
    done = submit(home, str(path))
    assert done.returncode == 1 and "is not UTF-8 text (byte 23); save it as UTF-8" in done.stderr
    assert done.stderr.strip().count("\n") == 0


def test_unquoted_yaml_times_in_a_spec(home: Path) -> None:
    (home / "t.yaml").write_text("name: t\nentrypoint: x\ntimeout: 2:00:00\nstop_grace: 1:30\nmin_time: 30\n")
    spec = load_spec(home / "t.yaml")
    assert (spec.timeout, spec.stop_grace, spec.min_time) == (7200, 90, 1800)


def test_kind_and_launcher_are_read_in_any_case(home: Path) -> None:
    spec = load_spec(write(home, "name: t\nkind: SPMD\nlauncher: TorchRun\ncommand: x.py\n"), [])
    assert (spec.kind, spec.launcher) == ("spmd", "torchrun")


def test_a_bare_off_or_no_turns_off_what_can_be_off(home: Path) -> None:
    """YAML reads `off` and `no` as false: the docs' `timeout: off` must mean off, not fail."""
    text = GOOD + "timeout: off\nretry_window: off\nhang_timeout: no\ninfeasible_grace: off\nmin_time: off\n"
    spec = load_spec(write(home, text), [])
    assert (spec.timeout, spec.min_time) == (None, None)
    assert (spec.retry_window, spec.hang_timeout, spec.infeasible_grace) == (
        0.0,
        0.0,
        0.0,
    )  # (off, not unset)
    assert load_spec(write(home, GOOD), ["timeout=off"]).timeout is None
    with pytest.raises(ConfigError, match=r"field 'stop_grace': false is a yes/no, not a duration"):
        load_spec(write(home, GOOD + "stop_grace: off\n"), [])  # (a grace cannot be off)


def test_too_many_files_names_the_folder_that_holds_them(tmp_path: Path) -> None:
    (tmp_path / "node_modules" / "x").mkdir(parents=True)
    for i in range(30):
        (tmp_path / "node_modules" / "x" / f"{i}.js").write_text("1")
    (tmp_path / "big.txt").write_bytes(b"x" * 4096)  # the most bytes, but not the many files
    (tmp_path / "train.py").write_text("print(1)\n")
    up = workdir.scan(tmp_path, [], max_files=20)
    assert up.stopped == "over 20 files"
    assert up.bulk() == ["node_modules/"]


def test_submit_name_names_the_job_and_a_bad_one_is_refused(home: Path) -> None:
    """`--name` (as `up --name`, sbatch's --job-name) was refused as an unknown option."""
    done = submit(home, "--name", "eval", "--", "python", "-c", "print(1)")
    assert done.returncode == 0, done.stderr
    (job,) = ledger.all_jobs("c4")
    assert job.name == "eval" and job.id.startswith("eval-")
    bad = submit(home, "--name", "my eval", write(home, GOOD))
    assert bad.returncode == 1 and bad.stderr.startswith(
        "raystack: error: --name 'my eval' is not a job name"
    )
    assert len(ledger.all_jobs("c4")) == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--sweep", "lr=1,2"], "--sweep 'lr=1,2': 'lr' is not a field of the spec; valid: after, "),
        (["--set", "nme=x"], "--set 'nme=x': 'nme' is not a field of the spec; valid: after, "),
        (["--set", "needs.gpu=1"], "--set 'needs.gpu=1': 'gpu' is not a field of needs; valid: cpus, "),
        (["--set", "env.LR", "1"], "--set env.LR: each option takes one word: --set env.LR=1"),
        (["--sweep", "env.LR", "1,2"], "--sweep env.LR: each option takes one word: --sweep env.LR=1,2"),
    ],
)
def test_set_and_sweep_typos_are_answered_with_the_fix(home: Path, args: list[str], said: str) -> None:
    """Before: --sweep's mistakes were named as --set's; `--set env.LR 1` was told "'1' before --"."""
    done = submit(home, *args, "--", "python", "-c", "print(1)")
    assert done.returncode == 1 and done.stderr.startswith(f"raystack: error: {said}"), done.stderr
    hint = {
        "lr": "; an environment variable is env.lr",
        "nme": "; did you mean name?",
        "needs.gpu": "; did you mean gpus?",
    }
    key = args[1].split("=")[0]
    assert done.stderr.rstrip().endswith(hint.get(key, "")) and "\n" not in done.stderr.rstrip(), done.stderr
    assert ledger.all_jobs("c4") == []


def test_a_sweep_value_with_a_comma_is_double_quoted() -> None:
    """Before: --sweep 'env.ARGS="--a 1,--b 2",x' queued three jobs, `"--a 1`, `--b 2"` and `x`."""
    from raystack.spec.resolve import parse_sweep

    assert parse_sweep('env.ARGS="--a 1,--b 2", x') == ("env.ARGS", ["--a 1,--b 2", "x"])
    assert parse_sweep("env.LR=[1e-6, 3e-6]") == ("env.LR", ["1e-6", "3e-6"])
    assert parse_sweep("env.LR=1e-6,,3e-6") == ("env.LR", ["1e-6", "3e-6"])


def test_one_exclude_pattern_and_a_line_of_launcher_args_are_taken_as_written() -> None:
    """As a person writes them in YAML: a single pattern, the launcher's arguments as one line."""
    spec = JobSpec.model_validate({"name": "t", "entrypoint": "x", "excludes": "*.ckpt"})
    assert spec.excludes == ["*.ckpt"]
    spmd = {"name": "t", "kind": "spmd", "launcher": "torchrun", "command": "train.py"}
    spec = JobSpec.model_validate({**spmd, "launcher_args": "--max-restarts 2 --rdzv-conf 'timeout=900'"})
    assert spec.launcher_args == ["--max-restarts", "2", "--rdzv-conf", "timeout=900"]
    with pytest.raises(ValueError, match=r"No closing quotation \(quote it as a shell would\)"):
        JobSpec.model_validate({**spmd, "launcher_args": "--a 'b"})
    with pytest.raises(
        ValueError, match=r"4 is not a mapping: needs takes gpus, .* e\.g\. needs: \{gpus: 4\}"
    ):
        JobSpec.model_validate({"name": "t", "entrypoint": "x", "needs": 4})


def test_one_quoted_word_after_dashes_is_a_shell_line_as_ray_job_submit_runs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`raystack submit -- 'echo LR=$LR'` failed only at run time with exit 127 (the shell looked
    for a program named `echo LR=$LR`); ray job submit joins its words into one shell line."""
    spec = command_spec(["echo LR=$LR && echo done"])
    assert spec.entrypoint == "echo LR=$LR && echo done" and spec.name == "echo"
    assert "run by the shell as a command line" in caplog.text
    ran = subprocess.run(
        ["sh", "-c", jobs.driver_entrypoint(spec.entrypoint)], env={"LR": "3e-6", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.split() == ["LR=3e-6", "done"], ran
    assert command_spec(["python", "train.py", "--name", "a b"]).entrypoint == "python train.py --name 'a b'"


def test_yaml_merge_keys_work_and_their_anchors_live_under_x_keys(home: Path) -> None:
    """`<<: *defaults` (YAML's merge key) fills a mapping, its own keys winning; the anchors'
    holder is a top-level x- key, which raystack leaves out; a mapping under an unknown key says
    so; a duplicate key is still refused."""
    text = (
        "x-env: &common\n  LR: '1e-6'\n  SEED: '1'\n"
        "name: t\nentrypoint: x\nenv:\n  <<: *common\n  SEED: '2'\n"
    )
    spec = load_spec(write(home, text), [])
    assert spec.env == {"LR": "1e-6", "SEED": "2"}
    with pytest.raises(
        ConfigError, match=r"unknown key 'defaults' \(a key that holds YAML anchors .* name it x-defaults\)"
    ):
        load_spec(write(home, text.replace("x-env", "defaults")), [])
    with pytest.raises(ConfigError, match="duplicate key"):
        load_spec(write(home, text + "  SEED: '3'\n"), [])
