"""Parsers over SLURM output recorded on the testbed (tests/fixtures/slurm, SLURM 22.05)."""

from __future__ import annotations

import json

import pytest

from raystack.adapters import slurm
from raystack.adapters.slurm import SlurmState as JobState
from raystack.errors import SlurmError

from ..conftest import FIXTURES


def fixture(name: str) -> str:
    return (FIXTURES / "slurm" / name).read_text()


def test_squeue_json_running_and_pending() -> None:
    jobs = slurm.parse_squeue_json(fixture("squeue-running-pending.json"))
    assert jobs["1"].state is JobState.RUNNING
    assert jobs["1"].name == "name with space"
    assert jobs["1"].nodes == "node[1-2]"
    assert jobs["1"].node_count == 2
    assert jobs["1"].time_limit_min == 10
    assert jobs["1"].end_time - jobs["1"].start_time == 600
    assert jobs["2"].state is JobState.PENDING
    assert jobs["2"].reason == "Resources"


def test_squeue_json_finished_states() -> None:
    jobs = slurm.parse_squeue_json(fixture("squeue-finished.json"))
    assert {k: v.state for k, v in jobs.items()} == {
        "1": JobState.CANCELLED,
        "2": JobState.CANCELLED,
        "3": JobState.FAILED,
    }
    assert jobs["3"].reason == "NonZeroExitCode"
    assert all(j.state.is_terminal() for j in jobs.values())


def test_squeue_json_newer_slurm_shapes() -> None:
    """SLURM >= 23.02 wraps numbers and makes job_state a list: same JobInfo."""
    data = json.loads(fixture("squeue-running-pending.json"))
    for job in data["jobs"]:
        job["job_state"] = [job["job_state"]]
        for key in ("job_id", "start_time", "end_time", "time_limit", "node_count"):
            job[key] = {"set": True, "infinite": False, "number": job[key]}
    assert slurm.parse_squeue_json(json.dumps(data)) == slurm.parse_squeue_json(
        fixture("squeue-running-pending.json")
    )


def test_squeue_json_invalid_is_a_slurm_error() -> None:
    with pytest.raises(SlurmError, match="invalid JSON"):
        slurm.parse_squeue_json("squeue: error: something")


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("RUNNING", JobState.RUNNING),
        ("CANCELLED by 0", JobState.CANCELLED),
        ("OUT_OF_MEMORY", JobState.OUT_OF_MEMORY),
        ("NODE_FAIL", JobState.NODE_FAIL),
        ("SOMETHING_NEW", JobState.UNKNOWN),
        ("", JobState.UNKNOWN),
    ],
)
def test_state_table(raw: str, state: JobState) -> None:
    assert JobState.parse(raw) is state


def test_terminal_and_active() -> None:
    assert JobState.TIMEOUT.is_terminal() and not JobState.TIMEOUT.is_active()
    assert JobState.PENDING.is_active() and not JobState.PENDING.is_terminal()
    assert not JobState.UNKNOWN.is_terminal() and not JobState.UNKNOWN.is_active()


@pytest.mark.parametrize(("out", "job"), [("123\n", "123"), ("77;cluster2\n", "77"), ("warn\n9\n", "9")])
def test_sbatch_parsable(out: str, job: str) -> None:
    assert slurm.parse_sbatch_parsable(out) == job


def test_sbatch_parsable_garbage() -> None:
    with pytest.raises(SlurmError, match="could not read a job id"):
        slurm.parse_sbatch_parsable("Submitted batch job 5")


def test_sacct_parsable2_skips_steps() -> None:
    # The format raystack asks for (slurm.SACCT_FIELDS); the testbed has no accounting
    # database (see fixtures/slurm/sacct-disabled.txt), so this line is written by hand.
    text = "42|TIMEOUT|raystack-a|node[1-2]|2026-01-01T00:00:00|2026-01-02T00:00:00|0:0\n"
    text += "42.batch|CANCELLED|batch|node1|x|y|0:15\n"
    jobs = slurm.parse_sacct(text)
    assert list(jobs) == ["42"]
    assert jobs["42"].state is JobState.TIMEOUT


def test_sacct_disabled_message_is_recorded() -> None:
    assert "accounting storage is disabled" in fixture("sacct-disabled.txt")
