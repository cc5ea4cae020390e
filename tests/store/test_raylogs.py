"""Ray's logs in the cluster folder: the capped copy, reading it back, a node's copy passes over a
real (Ray-shaped) log folder, and a job's view gathered from the copies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raystack.allocation.node.logsync import LogSync
from raystack.spec.profile import Caps
from raystack.store import cluster as records
from raystack.store import paths, raylogs, workerlogs
from raystack.store.ledger import Attempt, JobRecord, JobRequest
from raystack.store.raylogs import CappedCopy, read_copy
from raystack.store.workerlogs import first_error

KB = 1024


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "home"))
    records.create("c")
    return tmp_path


def lines(start: int, count: int) -> bytes:
    return b"".join(b"line %08d\n" % i for i in range(start, start + count))


def test_a_copy_keeps_the_start_and_the_end_within_its_cap(tmp_path: Path) -> None:
    copy = CappedCopy(tmp_path / "w.err", 64 * KB)
    original, at = b"", 0
    for chunk in range(200):  # 200 x 1.4 KB appended: ~280 KB through a 64 KB copy
        data = lines(chunk * 100, 100)[: 1400 + chunk % 7]
        first, last = copy.plan(len(data))
        copy.append(data[:first], at, 1 << 30)
        if last:
            copy.append(data[-last:], at + len(data) - last, 1 << 30)
        original, at = original + data, at + len(data)
        assert copy.footprint == sum(p.stat().st_size for p in copy.parts() if p.exists())
        assert copy.footprint <= 64 * KB
    text = read_copy(tmp_path / "w.err")
    assert text.startswith(original[: 32 * KB].decode())  # the whole start
    assert text.endswith(original[-8 * KB :].decode())  # and at least a segment of the end
    assert "bytes of the original not kept" in text


def test_a_copy_that_fits_reads_back_whole(tmp_path: Path) -> None:
    copy = CappedCopy(tmp_path / "raylet.out", 64 * KB)
    data = lines(0, 3000)  # 45 KB: past the head, into the tail, nothing dropped
    for i in range(0, len(data), 1000):
        copy.append(data[i : i + 1000], i, 1 << 30)
    assert read_copy(tmp_path / "raylet.out") == data.decode()


def test_the_node_allowance_bounds_growth(tmp_path: Path) -> None:
    copy = CappedCopy(tmp_path / "a.out", 64 * KB)
    grown = copy.append(lines(0, 1000), 0, 5000)
    assert grown == 5000 == copy.footprint


def test_first_error_finds_the_exception_that_ends_a_traceback() -> None:
    text = "\n".join(
        [
            ":job_id:02000000",
            ":actor_name:Learner",
            "step 1 loss 0.3",
            "Traceback (most recent call last):",
            '  File "learner.py", line 9, in step',
            "    raise torch.OutOfMemoryError('CUDA out of memory')",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ]
    )
    assert first_error(text) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert first_error("all fine\nstep 2\n") is None
    assert first_error("x\nNCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error\n") == (
        "NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
    )


def ray_logs(tmp: Path) -> Path:
    logs = tmp / "ray" / "session_latest" / "logs"
    (logs / "old").mkdir(parents=True)
    return logs


def test_a_pass_appends_only_new_bytes_follows_moved_files_and_skips_rotated_ones(home: Path) -> None:
    logs = ray_logs(home)
    w = "worker-" + "ab" * 28 + "-ffffffff-4121.err"
    (logs / w).write_bytes(b":job_id:02000000\n:actor_name:Learner\n")
    (logs / "raylet.out").write_bytes(b"raylet starts\n")
    (logs / "raylet.out.1").write_bytes(b"rotated\n")
    (logs / "debug_state.txt").write_bytes(b"rewritten in place\n")
    sync = LogSync("c", "node3", "77", home / "ray", Caps(every=0, file_mb=1, node_mb=10)).start()
    try:
        sync.sync()
        dest = paths.cluster("c").ray_host_logs("node3")
        assert (dest / w).read_bytes() == b":job_id:02000000\n:actor_name:Learner\n"
        assert not (dest / "raylet.out.1").exists() and not (dest / "debug_state.txt").exists()
        with open(logs / w, "ab") as fh:
            fh.write(b"Traceback (most recent call last):\nValueError: boom\n")
        os.replace(logs / w, logs / "old" / w)  # Ray moves a dead worker's log to old/
        inode = (dest / w).stat().st_ino
        sync.sync()
        assert (dest / w).read_bytes().endswith(b"ValueError: boom\n")
        assert (dest / w).stat().st_ino == inode  # appended, not rewritten
        assert raylogs.synced(dest) > 0
    finally:
        sync.final()


def test_the_node_cap_holds_and_a_new_allocation_moves_the_old_copies_aside(home: Path) -> None:
    logs = ray_logs(home)
    caps = Caps(every=0, file_mb=0.25, node_mb=0.5)
    sync = LogSync("c", "node2", "77", home / "ray", caps).start()
    for n in range(6):
        (logs / f"worker-{n:056x}-ffffffff-{100 + n}.out").write_bytes(lines(0, 20000))  # 300 KB each
    sync.sync()
    sync.final()
    dest = paths.cluster("c").ray_host_logs("node2")
    parts = raylogs.copy_parts(dest)
    assert sum(p.stat().st_size for p in parts) <= caps.node_bytes
    assert all(p.stat().st_size <= caps.file_bytes for p in parts)
    LogSync("c", "node2", "78", home / "ray", caps).start().final()
    assert (dest / "77" / f"worker-{0:056x}-ffffffff-100.out").exists()
    assert raylogs.host_folder("c", "node2", "77") == dest / "77"
    assert raylogs.host_folder("c", "node2", "78") == dest


def test_gather_finds_a_jobs_workers_by_the_job_id_they_print_and_orders_errors(home: Path) -> None:
    logs = ray_logs(home)
    for pid, job, actor, err in [
        (11, "02000000", "Learner", "Traceback (most recent call last):\ntorch.OutOfMemoryError: OOM\n"),
        (12, "02000000", "Engine", "serving\n"),
        (13, "03000000", "Other", "Traceback (most recent call last):\nValueError: not ours\n"),
    ]:
        (logs / f"worker-{pid:056x}-ffffffff-{pid}.err").write_text(
            f":job_id:{job}\n:actor_name:{actor}\n{err}"
        )
    sync = LogSync("c", "node7", "77", home / "ray", Caps(every=0)).start()
    sync.final()
    request = JobRequest(id="j1", name="j1", cluster="c", entrypoint="python x.py")
    record = JobRecord(
        id="j1",
        name="j1",
        request=request,
        attempts=[Attempt(id="j1", allocation="77", ray_job_id="02000000")],
    )
    event = {
        "ip": "10.0.0.9",
        "pid": 40,
        "actor": "Helper",
        "error": "ray::Helper.f()\nKeyError: 'x'",
        "at": 1.0,
    }
    workers = workerlogs.gather("c", record, [event], {"10.0.0.9": "node9"})
    assert [w.label for w in workers] == [
        "node9 Helper pid 40",
        "node7 Learner pid 11",
        "node7 Engine pid 12",
    ]
    assert workerlogs.summary(workers) == "node9 Helper pid 40: KeyError: 'x'"
    assert workers[1].error == "torch.OutOfMemoryError: OOM"
    folder = paths.cluster("c").job_files("j1")
    assert "OutOfMemoryError" in (folder / "node7" / "Learner-11.err").read_text()
    assert [w.label for w in workerlogs.read_index("c", "j1") or []] == [w.label for w in workers]


def test_an_error_ray_recorded_without_a_pid_names_no_pid(home: Path) -> None:
    request = JobRequest(id="j2", name="j2", cluster="c", entrypoint="python x.py")
    attempt = Attempt(id="j2", ray_job_id="05000000")
    record = JobRecord(id="j2", name="j2", request=request, attempts=[attempt])
    event = {"ip": "10.0.0.9", "pid": None, "actor": "Learner", "error": "RuntimeError: lost", "at": None}
    (worker,) = workerlogs.gather("c", record, [event], {"10.0.0.9": "node9"})
    assert workerlogs.summary([worker]) == "node9 Learner: RuntimeError: lost"


def test_a_worker_that_died_hard_is_named_by_its_last_stderr_error(home: Path) -> None:
    """cde9410: an actor that wrote `RuntimeError: KAPUTT-node3` to its stderr and then called
    os._exit(1) was named only by Ray's "The actor is dead because its worker process has died
    ... connection error code 2" (Ray's time of death is earlier than the copy of the stderr)."""
    logs = ray_logs(home)
    (logs / f"worker-{21:056x}-ffffffff-21.err").write_text(
        ":job_id:04000000\n:actor_name:Worker\nloading shard 3\nRuntimeError: KAPUTT-node3\n"
    )
    (logs / f"worker-{22:056x}-ffffffff-22.err").write_text(":job_id:04000000\n:actor_name:Quiet\nbye\n")
    LogSync("c", "node3", "77", home / "ray", Caps(every=0)).start().final()
    request = JobRequest(id="j4", name="j4", cluster="c", entrypoint="python x.py")
    record = JobRecord(
        id="j4",
        name="j4",
        request=request,
        attempts=[Attempt(id="j4", allocation="77", ray_job_id="04000000")],
    )
    died = (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
        "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."
    )
    events = [
        {
            "ip": "10.0.0.3",
            "pid": 21,
            "actor": "Worker",
            "error": f"ray.exceptions.ActorDiedError: {died}",
            "at": 1.0,
        },
        {"ip": "10.0.0.3", "pid": 22, "actor": "Quiet", "error": died, "at": 2.0},
    ]
    workers = workerlogs.gather("c", record, events, {"10.0.0.3": "node3"})
    first = workerlogs.summary(workers)
    assert first is not None and first.startswith(
        "node3 Worker pid 21: RuntimeError: KAPUTT-node3 (then its process died"
    )
    quiet = next(w for w in workers if w.actor == "Quiet")
    # (a last line that is no error says nothing: Ray's words, short, with what they mean)
    assert quiet.error == (
        "its process died abruptly (killed by a signal such as SIGKILL or the out-of-memory killer, "
        "or a crash such as SIGSEGV; Ray: SYSTEM_ERROR)"
    )


def test_a_failed_tasks_record_without_a_pid_is_its_actors(home: Path) -> None:
    """GRPO on the testbed, a vLLM engine SIGKILLed mid-generate: Ray's record of the failed task
    `Engine.generate` had no pid, and the job's message named 'node1 Engine' twice, once with its
    last stderr lines (weights loading, a socket warning) taken for the cause."""
    logs = ray_logs(home)
    (logs / f"worker-{31:056x}-ffffffff-31.err").write_text(
        ":job_id:05000000\n:actor_name:Engine\nLoading safetensors checkpoint shards: 100% Completed\n"
        "[rank0]:[W1126 19:32:25.056407964 socket.cpp:207] [c10d] The hostname of the client socket "
        "cannot be retrieved.\n"
    )
    LogSync("c", "node1", "77", home / "ray", Caps(every=0)).start().final()
    request = JobRequest(id="j5", name="j5", cluster="c", entrypoint="python x.py")
    attempt = Attempt(id="j5", allocation="77", ray_job_id="05000000")
    record = JobRecord(id="j5", name="j5", request=request, attempts=[attempt])
    died = (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
        "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."
    )
    events = [  # (a local cluster on 2 x H100: Ray named the node by an address it was not started with)
        {"ip": "192.0.2.2", "pid": None, "actor": "Engine", "error": f"ActorDiedError: {died}", "at": 5.0},
        {"ip": "127.0.0.1", "pid": 31, "actor": "Engine", "error": died, "at": 5.1},
    ]
    workers = workerlogs.gather("c", record, events, {"127.0.0.1": "node1"})
    assert [w.pid for w in workers if w.actor == "Engine"] == [31]
    assert workerlogs.summary(workers) == (
        "node1 Engine pid 31: its process died abruptly (killed by a signal such as SIGKILL or the "
        "out-of-memory killer, or a crash such as SIGSEGV; Ray: SYSTEM_ERROR)"
    )


def test_an_engine_killed_while_a_learner_sends_it_weights_is_named_before_the_learner(home: Path) -> None:
    """1 x H200, grpo_tiny with its vLLM engine in its actor's process: the engine SIGKILLed during
    the weight sync failed the learner's gloo send at once ("Connection closed by peer"), and Ray
    recorded the engine's death after it, so the job's message named the learner. The death is
    the cause; the learner's error follows it in the message."""
    request = JobRequest(id="j6", name="j6", cluster="c", entrypoint="python grpo_tiny.py")
    attempt = Attempt(id="j6", ray_job_id="06000000")
    record = JobRecord(id="j6", name="j6", request=request, attempts=[attempt])
    died = (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
        "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."
    )
    gloo = "RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:45280"
    events = [
        {"ip": "127.0.0.1", "pid": 30, "actor": "Learner", "error": f"ray::Learner.f()\n{gloo}", "at": 10.0},
        {"ip": "127.0.0.1", "pid": 31, "actor": "Engine", "error": f"ActorDiedError: {died}", "at": 10.4},
    ]
    workers = workerlogs.gather("c", record, events, {"127.0.0.1": "vm"})
    assert [w.actor for w in workers] == ["Engine", "Learner"]
    assert workerlogs.summary(workers) == (
        "vm Engine pid 31: its process died abruptly (killed by a signal such as SIGKILL or the "
        "out-of-memory killer, or a crash such as SIGSEGV; Ray: SYSTEM_ERROR); "
        f"then vm Learner pid 30: {gloo}"
    )
    # A death long after a peer's error is not its cause; an error of another kind is its own.
    events[1]["at"] = 10.0 + workerlogs.CAUSE + 1
    workers = workerlogs.gather("c", record, events, {"127.0.0.1": "vm"})
    assert [w.actor for w in workers] == ["Learner", "Engine"]
    events[0]["error"], events[1]["at"] = "ray::Learner.send()\nValueError: bad shape", 10.4
    workers = workerlogs.gather("c", record, events, {"127.0.0.1": "vm"})
    assert workerlogs.summary(workers) == "vm Learner pid 30: ValueError: bad shape"


def test_logs_all_of_a_running_job_gathers_into_the_users_cache_not_the_cluster_folder(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 66: readers only read. `raystack logs ID --all` of a job in flight gathered its
    workers' logs into the cluster folder (logs/jobs/<id>/), which only the cluster's own programs
    write; now into $XDG_CACHE_HOME/raystack/logs/<cluster>/<id>/, and the tail reads them there."""
    from raystack.client.job import Job
    from raystack.store import queue
    from raystack.store.ledger import JobState, update_job

    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    logs = ray_logs(home)
    (logs / f"worker-{11:056x}-ffffffff-11.err").write_text(
        ":job_id:02000000\n:actor_name:Learner\nTraceback (most recent call last):\nValueError: boom\n"
    )
    LogSync("c", "node7", "77", home / "ray", Caps(every=0)).start().final()
    queue.enqueue(JobRequest(id="j9", name="j9", cluster="c", entrypoint="python x.py"))
    assert queue.start("c", queue.waiting("c")[0], "77") is not None
    update_job("c", "j9", attempt={"ray_job_id": "02000000"}, state=JobState.RUNNING)
    job = Job("c", "j9")
    [worker] = job.workers()
    assert worker.error == "ValueError: boom"
    cache = home / "cache" / "raystack" / "logs" / "c" / "j9"
    assert job.workers_folder == cache and (cache / "node7" / "Learner-11.err").exists()
    assert "ValueError: boom" in job.worker_tail(worker)
    assert not paths.cluster("c").job_files("j9").exists()  # (nothing written there)
