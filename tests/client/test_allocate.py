"""The allocation plan and script: golden files, quoting that survives a real shell."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raystack import slurmtime
from raystack.adapters.slurm import NodeShape
from raystack.client import allocate
from raystack.client.allocate import AllocationPlan
from raystack.client.fits import unknown_features
from raystack.errors import ConfigError, SlurmUnavailable
from raystack.spec.profile import Profile

from ..conftest import wait_until

GOLDEN = Path(__file__).parents[1] / "golden"
REPO = Path(__file__).resolve().parents[2]

TRICKY = {
    "WITH_SPACES": "a value with spaces",
    "WITH_QUOTES": 'it\'s "quoted"',
    "WITH_DOLLAR": "$HOME and `date` stay literal",
    "WITH_NEWLINE": "line one\nline two",
    "NCCL_NET": "AWS Libfabric",
}


def tricky_plan() -> AllocationPlan:
    profile = Profile(
        name="site",
        partition="gpu batch",
        account="proj's",
        time="1-00:00:00",
        gpus_per_node=4,
        gpu_type="h100",
        cpus_per_task=72,
        setup=["module load cuda/12.6", 'source "/shared/my venv/bin/activate"'],
        env=TRICKY,
        local_scratch="/local scratch",
        object_store_memory="2GB",
        exclusive=True,
        extra_sbatch=["--comment=a b"],
    )
    return AllocationPlan(
        profile=profile,
        nodes=4,
        name="grpo-7b",
        home="/shared/it's home/.raystack",
        time=profile.time,
        walltime=slurmtime.time_to_seconds(profile.time),
        partition=profile.partition,
        account=profile.account,
        gpus_per_node=4,
        cpus_per_task=72,
        python="/shared/my venv/bin/python",
        extra_sbatch=tuple(profile.extra_sbatch),
        env=dict(profile.env),
    )


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RAYSTACK_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with RAYSTACK_UPDATE_GOLDEN=1 if intended"


def test_script_golden() -> None:
    check_golden("tricky.sbatch", allocate.render_script(tricky_plan()))


def test_sbatch_argv_golden() -> None:
    check_golden("tricky.argv", "\n".join(tricky_plan().sbatch_argv()) + "\n")


def test_argv_keeps_values_whole() -> None:
    argv = tricky_plan().sbatch_argv()
    assert "--partition=gpu batch" in argv
    assert "--account=proj's" in argv
    assert "--gpus-per-node=h100:4" in argv
    assert argv[-1] == "/shared/it's home/.raystack/clusters/grpo-7b/raystack.sbatch"


def test_script_is_valid_bash_and_exports_survive_quoting(tmp_path: Path) -> None:
    script = allocate.render_script(tricky_plan())
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # Run the script up to the point where it would start srun, and read its environment.
    prefix = script.split('\nlogs="', 1)[0]
    prefix = "\n".join(line for line in prefix.splitlines() if not line.startswith(("module", "source")))
    out = subprocess.run(
        ["bash", "-c", prefix + "\nenv -0"], capture_output=True, text=True, check=True
    ).stdout
    env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    for key, value in TRICKY.items():
        assert env[key] == value
    assert env["RAYSTACK_HOME"] == "/shared/it's home/.raystack"
    assert env["RAYSTACK_LOCAL_SCRATCH"] == "/local scratch"


def test_setup_lines_run_without_set_u_and_it_is_restored_after() -> None:
    """module load and conda activate scripts read unset variables: that must not kill the job."""
    plan = tricky_plan()
    profile = plan.profile.model_copy(update={"setup": ['echo "setup saw [${NEVER_SET_ANYWHERE}]"']})
    script = allocate.render_script(dataclasses.replace(plan, profile=profile))
    prefix = script.split('\nlogs="', 1)[0]
    done = subprocess.run(
        ["bash", "-c", prefix + '\necho "after: ${ALSO_UNSET}"'], capture_output=True, text=True
    )
    assert "setup saw []" in done.stdout
    assert done.returncode != 0 and "ALSO_UNSET: unbound variable" in done.stderr  # set -u is back


def test_hand_template_is_committed() -> None:
    """slurm/raystack.sbatch is the generic script; it must match what raystack renders."""
    committed = (REPO / "slurm" / "raystack.sbatch").read_text()
    assert committed == allocate.hand_template(), (
        "slurm/raystack.sbatch is stale: python -c 'from raystack.client import allocate; "
        'print(allocate.hand_template(), end="")\' > slurm/raystack.sbatch'
    )


def test_hand_template_takes_name_and_home_from_the_environment() -> None:
    text = allocate.hand_template()
    assert 'RAYSTACK_CLUSTER="${RAYSTACK_CLUSTER:-slurm-$SLURM_JOB_ID}"' in text
    assert 'RAYSTACK_HOME="${RAYSTACK_HOME:-$HOME/.raystack}"' in text
    assert "-m raystack.allocation.node" in text


GH200 = NodeShape(partition="gh", cpus=288, gpus=4, nodes=10, uniform=True)


def test_plan_uses_profile_defaults_and_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    plan = allocate.plan(2, profile="isambard", name="x", shape=GH200)
    assert plan.time == "24:00:00" and plan.gpus_per_node == 4 and "--exclusive" in plan.sbatch_argv()
    plan = allocate.plan(
        2, profile="isambard", name="x", time="2:00:00", gpus_per_node=2, partition="p", shape=GH200
    )
    assert {"--time=2:00:00", "--gpus-per-node=2", "--partition=p"} <= set(plan.sbatch_argv())


def test_without_a_profile_whole_nodes_are_asked_and_said(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    assert allocate.wants_node_shape(allocate.load_profile("generic"), None, None)
    plan = allocate.plan(4, name="x", shape=GH200)
    argv = plan.sbatch_argv()
    assert {"--cpus-per-task=288", "--gpus-per-node=4", "--mem=0"} <= set(argv)
    assert "whole nodes: 288 CPUs and 4 GPUs per node, all memory, as partition gh's nodes" in plan.note
    assert "# whole nodes: 288 CPUs" in allocate.render_script(plan)
    # Flags override what sinfo says; a profile with counts needs no sinfo at all.
    plan = allocate.plan(4, name="x", shape=GH200, gpus_per_node=2, cpus_per_task=20)
    assert {"--cpus-per-task=20", "--gpus-per-node=2"} <= set(plan.sbatch_argv())
    assert not allocate.wants_node_shape(allocate.load_profile("testbed"), None, None)
    odd = NodeShape(partition="mix", cpus=32, gpus=8, nodes=3, uniform=False)
    assert "the smallest node: they differ" in allocate.plan(1, name="x", shape=odd).note
    with pytest.raises(ConfigError, match="give --gpus-per-node and --cpus-per-task"):
        allocate.plan(1, name="x")


def test_what_the_partition_cannot_hold_is_refused_before_sbatch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"--nodes 11: partition gh has 10 node\(s\) \(sinfo\); ask at most 10"
    ):
        allocate.plan(11, name="x", shape=GH200)
    with pytest.raises(ConfigError, match=r"--gpus-per-node 8: partition gh's nodes have 4 GPUs"):
        allocate.plan(1, name="x", shape=GH200, gpus_per_node=8)
    with pytest.raises(ConfigError, match=r"--cpus-per-task 300: partition gh's nodes have 288 CPUs"):
        allocate.plan(1, name="x", shape=GH200, cpus_per_task=300)
    plan = allocate.plan(1, name="x", shape=GH200, gpus_per_node=8 // 2)  # (what fits is planned)
    assert "whole nodes: 288 CPUs per node" in plan.note and "GPUs per node" not in plan.note
    odd = NodeShape(partition="mix", cpus=32, gpus=4, nodes=3, uniform=False)
    assert allocate.plan(1, name="x", shape=odd, gpus_per_node=8).gpus_per_node == 8  # a larger node may


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, r"--nodes: 0 is not a positive number"),
        ({"nodes": -3}, r"--nodes: -3"),
        ({"nodes": 1, "time": "soon"}, r"--time: 'soon' is not a duration; use minutes, or SLURM's"),
        ({"nodes": 1, "time": "0"}, r"--time: '0' is no time at all"),
        ({"nodes": 1, "name": "bad name"}, r"--name: 'bad name' is not a valid cluster name"),
        ({"nodes": 1, "gpus_per_node": -1}, r"--gpus-per-node: -1 is negative"),
        ({"nodes": 1, "extra_sbatch": ["exclusive"]}, r"--sbatch 'exclusive' is not an sbatch option"),
        ({"nodes": 1, "extra_sbatch": ["--nodes=8"]}, r"--nodes is raystack up's own option; use -N/--nodes"),
        ({"nodes": 1, "extra_sbatch": ["-pgpu"]}, r"--partition is raystack up's own option; use -p"),
        ({"nodes": 1, "extra_sbatch": ["--signal=USR1@60"]}, r"--signal.*; use --signal-lead"),
        ({"nodes": 1, "extra_sbatch": ["--array=1-4"]}, r"raystack sets --array itself"),
        ({"nodes": 1, "extra_sbatch": ["--ntasks-per-node=4"]}, r"one node program per node"),
        ({"nodes": 1, "extra_sbatch": ["--job-name=x"]}, r"use -J/--name"),
        ({"nodes": 1, "extra_sbatch": ["--tim=10"]}, r"--time is raystack up's own option"),
        ({"nodes": 1, "profile": "nope"}, r"unknown profile 'nope'"),
    ],
)
def test_bad_requests_fail_before_anything_is_submitted(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        allocate.plan(**kwargs)


def test_walltime_warning_leaves_a_flag_and_the_script_keeps_waiting(tmp_path: Path) -> None:
    """--signal=B:USR1 reaches the batch shell only; it must not end the script (or srun), and
    must leave the flag file the head polls for."""
    plan = tricky_plan()
    script = allocate.render_script(plan)
    assert "--signal=B:USR1@600" in plan.sbatch_argv()
    body = script.split('\nlogs="', 1)[1]
    fake = (
        f"RAYSTACK_HOME={tmp_path}; RAYSTACK_CLUSTER=c; SLURM_JOB_ID=42; SLURM_JOB_NUM_NODES=1\n"
        f"srun() {{ touch {tmp_path}/srun-started; sleep 1.5; return 3; }}\n"
        f'logs="{tmp_path}/logs"\n' + body.split("\n", 1)[1]
    )
    (tmp_path / "clusters" / "c").mkdir(parents=True)
    proc = subprocess.Popen(["bash", "-c", fake], stdout=subprocess.PIPE, text=True)
    wait_until(lambda: (tmp_path / "srun-started").exists(), 10, "the script to reach srun")
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=10)
    assert "walltime warning" in out
    assert (tmp_path / "clusters" / "c" / "walltime-warning-42").exists()
    assert proc.returncode == 3  # srun's own status, after the warning


@pytest.mark.parametrize(("field", "variable"), [("tls", "RAYSTACK_TLS"), ("metrics", "RAYSTACK_METRICS")])
def test_security_options_reach_the_node_program_only_when_on(field: str, variable: str) -> None:
    plan = tricky_plan()
    assert variable not in allocate.render_script(plan)
    profile = plan.profile.model_copy(update={field: True})
    script = allocate.render_script(dataclasses.replace(plan, profile=profile))
    assert f"export {variable}=1" in script


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"idle_timeout": 1800.0}, "export RAYSTACK_IDLE_TIMEOUT=1800"),
        (
            {"metrics": True, "prometheus": "/opt/prom/prometheus"},
            "export RAYSTACK_PROMETHEUS=/opt/prom/prometheus",
        ),
        ({"metrics": True, "grafana_host": "http://g:3000"}, "export RAY_GRAFANA_HOST=http://g:3000"),
    ],
)
def test_profile_options_reach_the_node_program(changes: dict, line: str) -> None:
    plan = tricky_plan()
    assert line.split("=")[0] not in allocate.render_script(plan)
    profile = plan.profile.model_copy(update=changes)
    assert line in allocate.render_script(dataclasses.replace(plan, profile=profile))


@pytest.mark.parametrize(
    ("window", "line"), [(None, "export RAYSTACK_JOIN_WINDOW=16"), (0, "export RAYSTACK_JOIN_WINDOW=0")]
)
def test_workers_join_in_waves_unless_the_profile_says_all_at_once(window: int | None, line: str) -> None:
    plan = tricky_plan()
    profile = plan.profile if window is None else plan.profile.model_copy(update={"join_window": window})
    assert line in allocate.render_script(dataclasses.replace(plan, profile=profile))


def test_up_warns_when_the_home_filesystem_has_less_room_than_the_folder_may_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    monkeypatch.setattr(allocate, "SMALL_FREE", 0)
    assert allocate.space_warning(Profile(folder_cap=None)) is None
    assert allocate.space_warning(Profile(folder_cap="1M")) is None
    warning = allocate.space_warning(Profile(folder_cap="1000000T"))
    assert (
        warning
        and f"RAYSTACK_HOME ({tmp_path})" in warning
        and "up to 1000000T (profile folder_cap)" in warning
    )
    monkeypatch.setattr(allocate, "SMALL_FREE", 1 << 62)  # more than any disk: "little room" alone warns
    assert "GB free" in (allocate.space_warning(Profile(folder_cap=None)) or "")


def test_starting_a_cluster_says_the_space_warning_for_the_python_api_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Said where the allocation starts (not only by the CLI), before anything is written."""
    from raystack.adapters.local import LocalAllocator

    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    monkeypatch.setattr(allocate, "SMALL_FREE", 1 << 62)
    monkeypatch.setattr(LocalAllocator, "submit", lambda self, script, options, log: "local-vm-0000")
    plan, ids = allocate.plan_local(gpus=0, cpus=1, profile=Profile(gpus_per_node=0), name="w")
    record = allocate.start_local(plan, ids)
    assert record.allocation_id == "local-vm-0000"
    assert any("raystack: warning: RAYSTACK_HOME" in r.getMessage() for r in caplog.records), caplog.text


def test_a_walltime_shorter_than_the_profiles_signal_lead_gets_a_quarter_of_it_as_lead() -> None:
    """`up -t 10` with a profile that warns 10 minutes ahead: not an error about an option the
    user never gave; SLURM warns a quarter of the walltime ahead, and the note says so."""
    profile = Profile(gpus_per_node=0, cpus_per_task=1, signal_lead="10m")
    plan = allocate.plan(1, profile=profile, name="x", time="10")
    assert plan.signal_lead == 150 and "--signal=B:USR1@150" in plan.sbatch_options()
    assert "the walltime 10m is not longer than profile generic's signal_lead (10m)" in plan.note
    assert allocate.plan(1, profile=profile, name="x", time="1:00:00").signal_lead == 600
    assert not allocate.plan(1, profile=profile, name="x", time="1:00:00").note
    with pytest.raises(ConfigError, match=r"--signal-lead: 15m is not less than the walltime 10 \(10m\)"):
        allocate.plan(1, profile=profile, name="x", time="10", signal_lead="15m")


@pytest.mark.parametrize(
    ("time", "text", "seconds"), [("2h", "2:00:00", 7200), ("1-2", "1-2", 93600), ("90", "90", 5400)]
)
def test_the_plan_reads_the_walltime_once_for_sbatch_and_for_the_record(
    time: str, text: str, seconds: int
) -> None:
    plan = allocate.plan(2, name="w", time=time, gpus_per_node=0, cpus_per_task=1)
    assert plan.time == text and plan.walltime == seconds
    assert f"--time={text}" in plan.sbatch_options()


def test_a_constraint_no_node_has_is_named_with_the_features_there() -> None:
    shape = NodeShape(
        partition="gh", cpus=72, gpus=4, nodes=4, uniform=True, features=frozenset({"h100", "ib"})
    )
    says = unknown_features("H100", shape)
    assert says == (
        "; --constraint H100: no node of partition gh has feature 'H100' (their features, sinfo -o "
        "'%N %f': h100, ib); did you mean h100? (names are case-sensitive)"
    )
    assert "feature 'bigmem'" in unknown_features("h100|bigmem", shape)
    assert "did you mean" not in unknown_features("bigmem", shape)
    assert "feature 'h10'" in unknown_features("[h10*2&ib]", shape)
    for fine in ("h100", "h100&ib", "[h100*2|ib*2]", "", None):
        assert unknown_features(fine, shape) == ""
    unlisted = NodeShape(partition="gh", cpus=72, gpus=4, nodes=4, uniform=True)  # (sinfo without %f)
    assert unknown_features("bigmem", unlisted) == ""


def test_a_host_whose_slurm_cannot_be_reached_is_told_so_and_nothing_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # slurm-client without a slurm.conf (or slurmctld's DNS SRV record): not a question of node size
    shims = tmp_path / "bin"
    shims.mkdir()
    for command in ("sinfo", "squeue", "sbatch"):
        (shims / command).write_text(
            f"#!/bin/sh\necho '{command}: fatal: Could not establish a configuration source' >&2\nexit 1\n"
        )
        (shims / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    with pytest.raises(SlurmUnavailable, match=r"configuration source"):
        allocate.plan_on_partition(2, profile="generic", name="x")
    assert not (tmp_path / "rs" / "clusters").exists()
    # each command says what it means for it: `up` submitted nothing; `check` can go without SLURM
    up = raystack("up", "--nodes", "2")
    assert up.returncode == 1, up.stderr
    assert (
        "SLURM did not answer (" in up.stderr and "): nothing was submitted; `raystack up` again" in up.stderr
    )
    check = raystack("check", str(Path(__file__).parents[2] / "jobs" / "debug" / "hello.yaml"))
    assert check.returncode == 1 and "Could not establish a configuration source" in check.stderr, (
        check.stderr
    )
    assert "give --gpus-per-node and --cpus-per-node" in check.stderr and "raystack up" not in check.stderr
    assert not (tmp_path / "rs" / "clusters").exists()


def raystack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raystack", *args], capture_output=True, text=True, timeout=60, check=False
    )
