"""What a hung job's evidence says in one line (store/diagnosis.py), on dumps recorded for real:
py-spy stacks and torch's flight recorders of a 2-rank NCCL job on 2 x H100 whose rank 1 never
joined the second all-reduce (tests/fixtures/gpu, torch 2.11.0+cu130, NCCL 2.28.9), and py-spy
stacks of the same hang over gloo on CPU (tests/fixtures/stacks/gloo, torch 2.13.0+cpu)."""

from __future__ import annotations

import os
import pickle
import shutil
import time
from pathlib import Path

from raystack.store import diagnosis

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GPU, GLOO = FIXTURES / "gpu", FIXTURES / "stacks" / "gloo"


def test_the_nccl_hang_on_two_h100s_names_the_rank_that_never_arrived() -> None:
    assert diagnosis.diagnose(GPU) == (
        "flight recorder: rank 0 at all_reduce #2 (not completed); rank 1 never reached it (last "
        "collective #1); rank 0 waits for the GPU (torch.cuda.synchronize) at hang.py:20; rank 1 "
        "never arrived (asleep in <module> (hang.py:17))"
    )


def test_a_gloo_hang_names_the_collective_and_the_rank_outside_it(tmp_path: Path) -> None:
    for f in GLOO.glob("wait-*.txt"):
        shutil.copy(f, tmp_path)
    procs = diagnosis.read_dumps(tmp_path)
    assert [(p.rank, p.world, p.host) for p in procs] == [(0, 2, "wait-node1"), (1, 2, "wait-node1")]
    assert diagnosis.stacks_summary(procs) == (
        "rank 0 waits in all_reduce at g.py:12; rank 1 never arrived (asleep in <module> (g.py:7))"
    )


def test_a_rank_that_spins_on_its_collective_is_said_to_run_where_it_spins(tmp_path: Path) -> None:
    for f in GLOO.glob("spin-*.txt"):
        shutil.copy(f, tmp_path)
    assert diagnosis.stacks_summary(diagnosis.read_dumps(tmp_path)) == (
        "rank 0 running in <module> (g.py:10); rank 1 asleep in <module> (g.py:7)"
    )


def test_ranks_in_the_same_place_are_said_once_and_processes_without_ranks_by_name(tmp_path: Path) -> None:
    frame = "    all_reduce (/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:3068)\n"
    for rank in range(3):
        text = f"# pid {100 + rank} rank {rank}/4 python: python train.py\n"
        text += f'Thread {100 + rank} (idle): "MainThread"\n{frame}    step (/work/train.py:88)\n'
        (tmp_path / f"node{rank}-{100 + rank}.txt").write_text(text)
    text = '# pid 7 rank 3/4 python: python train.py\nThread 7 (idle): "MainThread"\n'
    text += "    Condition.wait (/usr/lib/python3.12/threading.py:355)\n    load (/work/data.py:12)\n"
    (tmp_path / "node3-7.txt").write_text(text)
    assert diagnosis.stacks_summary(diagnosis.read_dumps(tmp_path)) == (
        "ranks 0, 1, 2 wait in all_reduce at train.py:88; "
        "rank 3 never arrived (asleep in Condition.wait at data.py:12)"
    )
    ray = tmp_path / "ray"
    ray.mkdir()
    (ray / "node2-9.txt").write_text(
        '# pid 9 ray::Learner.train: ray::Learner.train\nThread 9 (active): "MainThread"\n'
        "    get (/venv/lib/python3.12/site-packages/ray/_private/worker.py:2900)\n"
        "    train (/work/grpo.py:40)\n"
    )
    assert diagnosis.stacks_summary(diagnosis.read_dumps(ray)) == (
        "ray::Learner.train pid 9 on node2 running in get at grpo.py:40"
    )


def test_dumps_older_than_the_request_are_not_read(tmp_path: Path) -> None:
    shutil.copytree(GPU / "stacks", tmp_path / "stacks", copy_function=shutil.copy)
    shutil.copytree(GPU / "flight", tmp_path / "flight", copy_function=shutil.copy)
    old = time.time() - 3600
    for f in [*tmp_path.glob("*/*")][:1]:
        os.utime(f, (old, old))
    assert (
        len(diagnosis.read_dumps(tmp_path / "stacks", since=time.time() - 60))
        + len(diagnosis.read_flight(tmp_path / "flight", since=time.time() - 60))
        == 3
    )


def test_a_flight_recorder_dump_is_read_as_plain_data_only(tmp_path: Path) -> None:
    """A dump is written by the job's own process into the cluster folder: nothing in it is run."""

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    (tmp_path / "rank_0").write_bytes(pickle.dumps({"pg_status": Evil()}))
    (tmp_path / "rank_1").write_bytes((GPU / "flight" / "rank_1").read_bytes())
    (tmp_path / "rank_x").write_bytes(b"junk")
    found = diagnosis.read_flight(tmp_path)
    assert list(found) == [1] and not (tmp_path / "ran").exists()
    # rank 1 alone (its peer wrote nothing) shows nothing out of order
    assert diagnosis.flight_summary(found) == ""
    both = diagnosis.read_flight(GPU / "flight")
    both[1]["pg_status"]["0"]["last_enqueued_collective"] = 2
    both[1]["pg_status"]["0"]["last_completed_collective"] = 2
    both[0]["pg_status"]["0"]["last_completed_collective"] = 2
    assert diagnosis.flight_summary(both) == ""  # (every rank at the same collective, completed)


def test_a_missing_ranks_dump_is_named() -> None:
    dumps = diagnosis.read_flight(GPU / "flight")
    dumps[0]["pg_config"]["0"]["ranks"] = "[0, 1, 2, 3]"
    del dumps[1]
    assert diagnosis.flight_summary(dumps) == (
        "flight recorder: rank 0 at all_reduce #2 (not completed); no dump from ranks 1, 2, 3"
    )


def test_ray_jobs_are_described_by_their_busy_processes_only(tmp_path: Path) -> None:
    """The soak's hung Ray job named its job supervisor and every idle worker first (Ray's main
    loop between tasks), and the message hid where the stacks are."""
    loop = "    main_loop (/v/lib/python3.11/site-packages/ray/_private/worker.py:1069)\n"
    files = {
        "node1-1.txt": f'# pid 1 ray::JobSupervisor: x\nThread 1 (idle): "MainThread"\n{loop}',
        "node1-2.txt": f'# pid 2 ray::Worker: ray::Worker\nThread 2 (idle): "MainThread"\n{loop}',
        "node1-3.txt": '# pid 3 python: python faults.py hang\nThread 3 (idle): "MainThread"\n'
        "    get_objects (/v/lib/python3.11/site-packages/ray/_private/worker.py:900)\n"
        "    main (/work/faults.py:82)\n",
    }
    for n in range(4, 12):
        files[f"node2-{n}.txt"] = (
            f'# pid {n} ray::Worker.run: ray::Worker.run\nThread {n} (idle): "MainThread"\n'
            "    Event.wait (/usr/lib/python3.11/threading.py:629)\n    run (/work/faults.py:40)\n"
        )
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    said = diagnosis.stacks_summary(diagnosis.read_dumps(tmp_path))
    assert said.startswith("python pid 3 on node1 asleep in get_objects at faults.py:82; ")
    assert "JobSupervisor" not in said and "pid 2 " not in said
    assert said.endswith("; and 3 more (the stacks)") and said.count("ray::Worker.run pid") == 5


def test_a_rank_without_a_stack_says_why(tmp_path: Path) -> None:
    """CI once saw a sleeping rank's dump come back without a thread: the cause says py-spy's reason."""
    (tmp_path / "n1-5.txt").write_text(
        '# pid 5 rank 0/2 python: python g.py\nThread 5 (idle): "MainThread"\n'
        "    all_reduce (/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3068)\n"
        "    main (/work/g.py:12)\n"
    )
    (tmp_path / "n2-6.txt").write_text(
        "# pid 6 rank 1/2 python: python g.py\n[py-spy: Error: Failed to copy PyCodeObject\n\nReason: x]\n"
    )
    assert diagnosis.stacks_summary(diagnosis.read_dumps(tmp_path)) == (
        "rank 0 waits in all_reduce at g.py:12; rank 1 never arrived (no Python stack: Error: Failed to copy "
        "PyCodeObject)"
    )


def test_a_thread_without_a_name_is_read(tmp_path: Path) -> None:
    """py-spy prints `Thread 6 (idle)` without the name where it cannot read threading's names (a
    process that never imported threading; CI once had a rank's dump read as having no stack)."""
    (tmp_path / "n1-5.txt").write_text(
        '# pid 5 rank 0/2 python: python g.py\nThread 5 (idle): "MainThread"\n'
        "    all_reduce (/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3068)\n"
        "    main (/work/g.py:12)\n"
    )
    (tmp_path / "n2-6.txt").write_text(
        "# pid 6 rank 1/2 python: python g.py\nProcess 6: python g.py\nPython v3.11.7 (/usr/bin/python3)\n\n"
        "Thread 61 (idle)\n    worker (/work/g.py:3)\nThread 6 (idle)\n    main (/work/g.py:7)\n"
    )
    assert diagnosis.stacks_summary(diagnosis.read_dumps(tmp_path)) == (
        "rank 0 waits in all_reduce at g.py:12; rank 1 never arrived (asleep in main (g.py:7))"
    )
