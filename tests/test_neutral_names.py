"""Issue 66: the scheduler's interface speaks no scheduler's words. The 0.1 names (SLURM's) stay one
release as deprecated aliases, in Python and in `status --json`."""

from __future__ import annotations

import dataclasses

import pytest

from raystack import errors
from raystack.client.status import ClusterStatus


def test_the_scheduler_errors_have_neutral_names_and_the_old_ones_are_aliases() -> None:
    assert errors.SlurmError is errors.SchedulerError
    assert errors.SlurmUnavailable is errors.SchedulerUnavailable
    assert errors.SlurmMissing is errors.SchedulerMissing
    assert errors.JobNotFound is errors.AllocationNotFound
    assert errors.JobEnding is errors.AllocationEnding
    assert issubclass(errors.SchedulerMissing, errors.SchedulerUnavailable)
    assert issubclass(errors.AllocationNotFound, errors.SchedulerError)


def test_status_json_has_neutral_fields_and_the_old_ones_marked_deprecated() -> None:
    fields = {f.name for f in dataclasses.fields(ClusterStatus)}
    assert not {f for f in fields if "slurm" in f}, fields
    st = ClusterStatus(
        name="c", state="STARTING", message="", allocation_id="7", allocation_state="PENDING",
        allocation_reason="Priority", time_left_s=None, nodes_expected=2, nodes_alive=None, gpus=None,
        cpus=None, dashboard_url=None, allocation_expected_start=1_800_000_000,
    )  # fmt: skip
    row = st.to_dict()
    assert (row["allocation_state"], row["allocation_reason"]) == ("PENDING", "Priority")
    assert (row["slurm_state"], row["slurm_reason"], row["slurm_expected_start"]) == (
        "PENDING", "Priority", 1_800_000_000,
    )  # fmt: skip
    assert row["deprecated"] == ["slurm_expected_start", "slurm_reason", "slurm_state"]
    assert st.slurm_state == "PENDING"  # (the Python attribute of 0.1 too)


def test_a_profiles_native_options_are_judged_by_its_own_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch's option grammar lives in the SLURM adapter (adapters/slurm/options.py): a profile of
    another scheduler is not told `sbatch has no option -l` (PBS's `-l select=2`); its backend
    judges. The other scheduler here is SLURM's allocator under another name, without a grammar."""
    from pydantic import ValidationError

    from raystack.adapters import allocator as registry
    from raystack.adapters.slurm import SlurmAllocator
    from raystack.spec.profile import Profile

    class Other(SlurmAllocator):
        backend = "pbs-like"

        def check_native(self, option: str, source: str = "", profile: bool = False) -> str:
            return registry.Allocator.check_native(self, option, source, profile)

    monkeypatch.setitem(registry.ALLOCATORS, "pbs-like", Other())
    ok = Profile.model_validate({"name": "p", "extra_sbatch": ["--mail-type=END"]})
    assert ok.extra_sbatch == ["--mail-type=END"]
    with pytest.raises(ValidationError, match=r"sbatch has no option -l"):
        Profile.model_validate({"name": "p", "extra_sbatch": ["-l select=2"]})
    with pytest.raises(ValidationError, match="the pbs-like backend takes no options of its own") as other:
        Profile.model_validate({"name": "p", "backend": "pbs-like", "extra_sbatch": ["-l select=2"]})
    assert "sbatch has no option" not in str(other.value)
