"""A job's secrets (store/secrets.py, spec/submission.py): from the submitter's environment into
a 0600 file its driver sources, names only in the ledger, gone when the job ends."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec import submission
from raystack.spec.job import JobSpec
from raystack.store import queue
from raystack.store import secrets as job_secrets
from raystack.store.cluster import ClusterRecord
from raystack.store.ledger import JobRequest, JobState, read_job, update_job
from tests.allocation.test_runner import home  # noqa: F401 (the fixture)

VALUE = "hf_abc 'quoted' $HOME \"and\" `backticks`"


def test_the_values_come_from_the_environment_or_a_one_line_error() -> None:
    assert job_secrets.take(["HF_TOKEN"], {"HF_TOKEN": VALUE}) == {"HF_TOKEN": VALUE}
    with pytest.raises(
        ConfigError, match=r"^secrets: WANDB_API_KEY is not set in your environment; export it"
    ):
        job_secrets.take(["WANDB_API_KEY"], {})
    with pytest.raises(ConfigError, match="not an environment variable name"):
        job_secrets.take(["HF-TOKEN"], {"HF-TOKEN": "x"})
    with pytest.raises(ValueError, match="'1X' is not an environment variable name"):
        JobSpec(name="j", entrypoint="x", secrets=["1X"])
    assert JobSpec(name="j", entrypoint="x", secrets="A, B,A").secrets == ["A", "B"]


def test_the_driver_sources_them_and_the_ledger_keeps_names_only(home: Path) -> None:  # noqa: F811
    request = JobRequest(id="s-1", name="s", cluster="c", entrypoint="x", secrets=["HF_TOKEN"])
    path = job_secrets.keep("c", request.nonce, {"HF_TOKEN": VALUE})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    env = submission.job_env(request, ClusterRecord(name="c"))
    assert env["RAYSTACK_SECRETS"] == str(path) and env["RAYSTACK_SECRET_NAMES"] == "HF_TOKEN"
    assert VALUE not in repr(submission.submit_options(request, ClusterRecord(name="c")))
    entry = submission.driver_entrypoint("python -c \"import os; print(os.environ['HF_TOKEN'])\"", None, True)
    ran = subprocess.run(["sh", "-c", entry], env={**os.environ, **env}, capture_output=True, text=True)
    assert ran.stdout.strip() == VALUE, ran.stderr
    queue.enqueue(request)
    assert VALUE not in read_job("c", "s-1").model_dump_json() and path.exists()
    update_job("c", "s-1", state=JobState.FAILED)
    assert not path.exists()  # (gone with the job)
    gone = subprocess.run(["sh", "-c", entry], env={**os.environ, **env}, capture_output=True, text=True)
    assert gone.returncode == 1 and "secrets file" in gone.stderr and "is gone" in gone.stderr


def test_an_env_value_that_looks_like_a_secret_is_pointed_at_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert job_secrets.looks_secret(
        {"WANDB_API_KEY": "x", "HF_TOKEN": "y", "LR": "1e-6", "DB_PASSWORD": ""}
    ) == [
        "WANDB_API_KEY",
        "HF_TOKEN",
    ]
    from raystack.spec.resolve import resolve

    spec = JobSpec(name="j", entrypoint="x", env={"HF_TOKEN": "hf_1"})
    with caplog.at_level(logging.WARNING):
        resolve(spec, ClusterRecord(name="c"), Path.cwd(), "job j")
    assert "env.HF_TOKEN looks like a secret" in caplog.text and "secrets: [HF_TOKEN]" in caplog.text
