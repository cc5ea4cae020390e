"""Which SPMD jobs start on the launch hosts (launch/pool.py), and what their ranks get there:
the environment a launcher actor of the job would have had. The hosts themselves run in
tests/testbed/test_spmd.py."""

from __future__ import annotations

import os
import subprocess

import pytest

from raystack.launch.node import environ_of, rank_env
from raystack.launch.pool import unfit, visible_gpus

from ..conftest import wait_until

WD = "gcs://_ray_pkg_0123456789abcdef.zip"


@pytest.mark.parametrize(
    ("renv", "procs", "gpus", "env", "why"),
    [
        ({}, 4, 4, {}, None),
        ({"working_dir": WD, "env_vars": {"A": "1"}, "config": {"eager_install": True}}, 2, 2, {}, None),
        ({}, 1, 0, {}, None),  # (nodes without GPUs: one process each, nothing to split)
        ({"pip": ["x"]}, 4, 4, {}, "its runtime_env has pip"),
        ({"py_modules": ["gcs://m.zip"], "uv": ["y"]}, 4, 4, {}, "its runtime_env has py_modules, uv"),
        ({"working_dir": "s3://bucket/code.zip"}, 4, 4, {}, "is not a package Ray uploaded"),
        ({}, 2, 4, {}, "2 of a node's 4 GPUs"),
        ({}, 4, 4, {"RAYSTACK_SPMD_POOL": "0"}, "RAYSTACK_SPMD_POOL=0"),
    ],
)
def test_jobs_that_fit_the_hosts(renv: dict, procs: int, gpus: int, env: dict, why: str | None) -> None:
    said = unfit(renv, procs, gpus, env)
    assert (said is None) if why is None else (said is not None and why in said), said


def test_the_ranks_get_the_job_s_variables_and_its_working_dir_first_on_pythonpath() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/site", "HOME": "/h"}
    env = rank_env({"LR": "1e-4", "HOME": "/job"}, base, "/tmp/wd")
    assert env == {"PATH": "/bin", "PYTHONPATH": "/tmp/wd:/site", "HOME": "/job", "LR": "1e-4"}
    assert rank_env({"PYTHONPATH": "/mine"}, base, "/tmp/wd")["PYTHONPATH"] == "/tmp/wd:/mine"
    assert rank_env({}, base, None) == base and base["PYTHONPATH"] == "/site"  # (unchanged)


def test_a_whole_node_s_gpus_as_ray_numbers_them() -> None:
    assert visible_gpus({}, 4) == "0,1,2,3"
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, 2) == "2,3"  # (SLURM's, on a shared node)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 2) == "0,1"


def test_a_process_s_starting_environment_is_read_from_proc() -> None:
    # (a child of its own: an xdist worker starts with almost no environment and sets os.environ
    # afterwards, so the test's process is no witness)
    env = {"PATH": os.environ["PATH"], "RAYSTACK_MARK": "a=b c"}
    child = subprocess.Popen(["sleep", "60"], env=env)
    try:
        # (read once its exec has laid the environment out: Popen returns at the exec's start)
        assert wait_until(lambda: environ_of(str(child.pid)), 10, "the child's environment") == env
    finally:
        child.kill()
        child.wait()
    assert environ_of("") is None and environ_of("999999999") is None
