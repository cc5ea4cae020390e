"""The preparer's own rules (its work on a real cluster: tests/testbed/test_jobs_together.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raystack.adapters.ray import Dashboard
from raystack.allocation.runner.prepare import PREFIX, Preparer, wanted
from raystack.store.ledger import read_job
from raystack.waiting import FakeClock

from .test_runner import FakeApi, home, submit  # noqa: F401  (home: the fixture)


class Recording(FakeApi):
    """The SDK's uploads recorded; the throwaway job ends SUCCEEDED at once, on 3 nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[dict] = []
        self.deleted: list[str] = []
        api = self

        class Jobs:
            def _upload_working_dir_if_needed(self, renv: dict) -> None:
                api.uploads.append(dict(renv))
                if "working_dir" in renv:
                    renv["working_dir"] = "gcs://_ray_pkg_abc.zip"

            def _upload_py_modules_if_needed(self, renv: dict) -> None:
                pass

            def delete_job(self, sid: str) -> None:
                api.deleted.append(sid)
                del api.ray[sid]

        self.jobs = Jobs()

    upload = Dashboard.upload  # (the adapter's own, on the SDK functions faked above)

    def submit(self, sid: str, entrypoint: str, runtime_env: dict, **options: Any) -> None:
        super().submit(sid, entrypoint, {"env_vars": {}, **runtime_env}, **options)
        self.env[sid] = runtime_env
        self.set(sid, "SUCCEEDED", 0)
        self.log_text[sid] = "PREPARED 3\n"


def test_only_what_ray_makes_on_the_nodes_is_prepared() -> None:
    assert wanted({"env_vars": {"A": "1"}}) == []
    assert wanted({"working_dir": "/x", "pip": ["a"], "env_vars": {}}) == ["working_dir", "pip"]
    assert wanted({"conda": "env", "py_modules": []}) == ["conda"]


def test_a_job_is_prepared_once_its_upload_named_by_content_and_the_outcome_in_its_ledger(
    home: Path,  # noqa: F811
) -> None:
    api = Recording()
    job = submit(name="next")
    prep = Preparer("c", api, FakeClock())
    renv = {"working_dir": str(home), "env_vars": {"RAYSTACK_JOB_ID": job}}
    assert prep.ahead(job, "k1", renv)
    assert prep.thread is not None
    prep.thread.join(10)
    assert not prep.ahead(job, "k1", renv)  # (once per key)
    (sid,) = [s for s in api.submitted if s.startswith(PREFIX + job)]
    assert api.env[sid]["working_dir"] == "gcs://_ray_pkg_abc.zip"  # (the package the submit will name)
    assert api.deleted == [sid]  # (gone from Ray's list)
    assert read_job("c", job).prepared and read_job("c", job).prepared.startswith(
        "working_dir ready on 3 node(s)"
    )
    assert not prep.ahead(job, "k2", {"env_vars": {}})  # nothing to make: no throwaway job
    assert len(api.submitted) == 1


def test_packages_that_cannot_be_had_are_not_prepared_and_say_why(home: Path) -> None:  # noqa: F811
    api = Recording()
    job = submit(name="bad")
    prep = Preparer("c", api, FakeClock())
    assert prep.ahead(job, "k", {"py_executable": "/no/python", "pip": ["x"]})
    assert prep.thread is not None
    prep.thread.join(10)
    assert api.submitted == []
    said = read_job("c", job).prepared or ""
    assert said.startswith("pip not prepared: runtime_env py_executable: /no/python"), said
