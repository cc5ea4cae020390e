"""Progress, not busyness (allocation/watchdog/progress.py): the node's probe looks at real processes (their
threads' CPU, py-spy's stacks with their variables, their open files) and tells a loop that works
from one that spins in place, sleeps, or retries a check. The whole corpus of healthy and hung
programs runs as jobs in tests/testbed/test_hangs.py; here, the rule's parts one by one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack.allocation.watchdog.progress import (
    JobProgress,
    Look,
    ProgressProbe,
    computing,
    files_moved,
    thread_moved,
)
from raystack.allocation.watchdog.reading import (
    Opened,
    Thread,
    disk_wait,
    frame_key,
    open_files,
    pages_written,
    thread_cpu,
    to_sample,
)
from raystack.allocation.watchdog.stacks import py_spy
from raystack.store import paths
from raystack.store import progress as store
from tests.allocation.test_runner import home  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif(py_spy() is None, reason="py-spy comes with ray[default]")

# A loop whose stack changes every 0.1 s (the recursion goes one deeper), on a CPU all the time.
WALKS = """
import time
def walk(n):
    if n:
        return walk(n - 1)
    end = time.time() + 0.02
    while time.time() < end:
        pass
while True:
    walk(int(time.time() * 10) % 20)
"""
# On a CPU all the time inside one call, as a rank spinning in cudaStreamSynchronize: one stack.
SPINS = "any(iter(int, 1))\n"
SLEEPS = "import threading\nthreading.Event().wait()\n"  # asleep (an NCCL peer that never comes, on gloo)
# A poll loop that counts its tries: a variable that changes, in a thread that barely runs.
RETRIES = (
    "import time\ndef wait():\n    tries = 0\n    while True:\n        tries += 1\n        time.sleep(0.05)\n"
    "wait()\n"
)
# A loop that mostly waits (as for a GPU), its counter moving: 25 steps a second of 5 ms of work.
WAITS = (
    "import time\ndef train():\n    step = 0\n    while True:\n        end = time.time() + 0.005\n"
    "        while time.time() < end:\n            pass\n        time.sleep(0.035)\n        step += 1\n"
    "train()\n"
)


@pytest.fixture
def processes() -> Iterator[dict]:
    started: dict[str, subprocess.Popen] = {}

    def start(job: str, code: str) -> subprocess.Popen:
        env = {"RAYSTACK_JOB_ID": job, "PATH": "/usr/bin:/bin"}
        proc = subprocess.Popen([sys.executable, "-c", code], env=env)
        started[f"{job}-{proc.pid}"] = proc
        return proc

    yield {"start": start, "all": started}
    for proc in started.values():
        proc.kill()
        proc.wait()


def looked(probe: ProgressProbe, jobs: list[str], n: int, every: float = 0.6) -> dict[str, list[str]]:
    """`n` looks at each job, `every` s apart: the evidence each look found (no move: '')."""
    found: dict[str, list[str]] = {job: [] for job in jobs}
    for _ in range(n):
        for job in jobs:
            before = probe.jobs[job].moved
            probe.sample(job)
            row = probe.rows()[job]
            found[job].append(row.get("why", "") if row["moved"] != before else "")
        time.sleep(every)
    return found


def probe_of(jobs: list[str]) -> ProgressProbe:
    (paths.cluster("c").logs).mkdir(parents=True, exist_ok=True)
    store.watch("c", dict.fromkeys(jobs, 1.0))
    probe = ProgressProbe("c", "node1", look_every=0.0)
    probe._read_request()
    return probe


def test_what_works_moves_what_spins_sleeps_or_retries_does_not(home: Path, processes: dict) -> None:  # noqa: F811
    for job, code in (
        ("walks", WALKS),
        ("waits", WAITS),
        ("spins", SPINS),
        ("sleeps", SLEEPS),
        ("retries", RETRIES),
    ):
        processes["start"](job, code)
    time.sleep(1.0)  # (Python up and in its loop)
    probe = probe_of(["walks", "waits", "spins", "sleeps", "retries"])
    found = looked(probe, list(probe.jobs), 6)
    # (a busy 2-core machine: most looks, not every one, show the moving loops moving)
    assert sum(map(bool, found["walks"][1:])) >= 3 and sum(map(bool, found["waits"][1:])) >= 3, found
    assert set(found["waits"]) <= {"", "values"}, found  # (its counter, while it mostly sleeps)
    assert found["spins"][1:] == found["sleeps"][1:] == found["retries"][1:] == [""] * 5, found
    rows = probe.rows()
    assert rows["spins"]["procs"] == 1 and rows["spins"]["n"] == 6 and "why" not in rows["spins"]
    # a process of the job that starts is a sign of progress too
    processes["start"]("sleeps", SLEEPS)
    probe.sample("sleeps")
    assert probe.rows()["sleeps"]["why"] == "processes" and probe.rows()["sleeps"]["procs"] == 2


def test_a_thread_computing_in_one_native_call_moves(home: Path, processes: dict) -> None:  # noqa: F811
    """One long line in a BLAS kernel: Python shows nothing moving, its native frames compute."""
    pytest.importorskip("numpy")
    code = "import numpy as np\na = np.random.rand(2500, 2500)\nwhile True:\n    np.linalg.eigvals(a)\n"
    processes["start"]("blas", code)
    time.sleep(1.5)
    probe = probe_of(["blas"])
    probe.jobs["blas"].every = 0.0  # (the costly looks at once: nothing moved before)
    found = looked(probe, ["blas"], 4)
    assert "native" in found["blas"], found


def test_the_request_decides_what_is_sampled(home: Path) -> None:  # noqa: F811
    probe = ProgressProbe("c", "node1", look_every=0.0)
    probe()
    assert probe.rows() == {}
    (paths.cluster("c").logs).mkdir(parents=True, exist_ok=True)
    store.watch("c", {"a": 5.0, "b": 2.0})
    probe()
    deadline = time.time() + 30
    while time.time() < deadline and (probe.busy is None or probe.busy.is_alive()):
        time.sleep(0.05)
    assert {job: row["n"] for job, row in probe.rows().items()} == {"a": 1, "b": 1}  # (no processes)
    store.watch("c", {"b": 2.0})
    time.sleep(0.01)
    probe()
    assert list(probe.rows()) == ["b"]


def test_frames_keep_plain_values_and_leave_objects_out() -> None:
    frame = {
        "name": "train",
        "filename": "t.py",
        "line": 12,
        "locals": [
            {"name": "step", "repr": "950"},
            {"name": "loss", "repr": "<Tensor at 0x7f4d51a2ebc0>"},
            {"name": "l", "repr": "0.00148"},
            {"name": "cfg", "repr": '{"lr": 0.1, "opt": <SGD at 0x7f44>}'},
        ],
    }
    assert frame_key(frame) == ("train", "t.py", (("step", "950"), ("l", "0.00148")))
    assert frame_key({"name": "<module>", "filename": "s.py", "line": 5}) == ("<module>", "s.py", 5)
    dump = [
        {
            "os_thread_id": 7,
            "active": False,
            "frames": [frame, {"name": "<module>", "filename": "t.py", "line": 15}],
        }
    ]
    sample = to_sample(dump)
    assert list(sample) == [7] and sample[7].frames[0] == ("<module>", "t.py", 15)  # (outermost first)


def test_what_moved_between_two_samples_of_a_thread() -> None:
    top = ("<module>", "t.py", 20)
    a = Thread(False, (top, ("train", "t.py", (("step", "1"),))))
    assert (
        thread_moved(a, Thread(False, (top, ("train", "t.py", (("step", "2"),))))) == "values"
    )  # waiting or not
    assert thread_moved(a, a) is None
    deeper = Thread(True, (top, ("train", "t.py", (("step", "1"),)), ("forward", "m.py", ())))
    assert thread_moved(Thread(True, a.frames), deeper) == "stack"  # running at both, other functions
    assert thread_moved(a, deeper) is None  # (caught running once: a poll loop awake)
    # a frame of another function at the same depth: what is deeper is another call, not compared
    other = Thread(False, (top, ("evaluate", "t.py", (("step", "9"),))))
    assert thread_moved(a, other) is None


def native(*frames: tuple[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "module": module, "filename": module} for name, module in frames]


TORCH, GOMP, LIBC, CUDA = (
    "/x/libtorch_cpu.so",
    "/x/libgomp.so.1",
    "/usr/lib/libc.so.6",
    "/usr/lib/libcuda.so.1",
)


def test_native_frames_tell_compute_from_waits() -> None:
    """As py-spy --native showed them here (a BLAS chain; its OpenMP barrier) and as waits look."""
    assert computing(native(("mkl_blas_def_sgemm_kernel_0_zen", TORCH)))
    assert computing(
        native(("0x7fdf40a1e10f", GOMP), ("0x7fdf40a1ca9d", GOMP), ("mkl_blas_sgemm_omp_driver_v1", TORCH))
    )
    assert not computing([{"name": "<module>", "filename": "s.py", "line": 1}])  # Python's own loop
    assert not computing(native(("0x7f90c344524a", LIBC)))  # (unsymbolised: a wait or a copy)
    blas = "/x/libscipy_openblas64_.so"  # (numpy's eigvals: its main thread waits for its helpers)
    assert computing(
        native(("exec_blas_async_wait", blas), ("exec_blas", blas), ("gemm_driver.isra.0", blas))
    )
    assert not computing(native(("0x1", CUDA), ("cudaStreamSynchronize", "/x/libcudart.so.13")))
    assert not computing(
        native(("0x1", CUDA), ("cudaLaunchKernel", "/x/libcudart.so.13"), ("at::cuda::blas::gemm", TORCH))
    )
    assert not computing(native(("c10d::ProcessGroupGloo::AsyncWork::wait", TORCH)))
    assert not computing(
        native(("gloo::transport::tcp::UnboundBuffer::waitRecv", TORCH), ("at::native::x_kernel", TORCH))
    )
    assert not computing(native(("builtin_any", "/usr/lib/libpython3.11.so.1.0")))
    assert not computing([])
    poll = native(
        ("at::native::_local_scalar_dense_cpu", TORCH), ("at::_ops::_local_scalar_dense::call", TORCH)
    )
    assert not computing(poll)  # (`while flag.item() == 0`: a short call, polled)


def test_open_files_and_their_offsets(home: Path, tmp_path: Path, processes: dict) -> None:  # noqa: F811
    """A file being written moves; logs and the cluster folder (flight-recorder dumps) do not count."""
    data, log = tmp_path / "ckpt.bin", tmp_path / "train.log"
    inside = paths.cluster("c").root / "flight"
    inside.mkdir(parents=True)
    code = (
        f"import time\nf = open({str(data)!r}, 'wb')\ng = open({str(log)!r}, 'ab')\n"
        f"h = open({str(inside / 'rank_0')!r}, 'wb')\n"
        "while True:\n    for x in (f, g, h):\n        x.write(b'x' * 4096)\n        x.flush()\n"
        "    time.sleep(0.2)\n"
    )
    proc = processes["start"]("files", code)
    time.sleep(1.0)
    skip = str(paths.cluster("c").root)
    first = open_files(proc.pid, skip)
    assert {path for _, path in first} == {str(data)}, first
    time.sleep(0.5)
    second = open_files(proc.pid, skip)
    assert files_moved(Look({}, first), Look({}, second))
    assert not files_moved(Look({}, second), Look({}, second))
    assert files_moved(Look({}, {}), Look({}, {(3, "/x/new.pt"): Opened(0, True)}))  # opened for writing
    read = {(3, "/x/data.bin"): Opened(0, False)}
    assert not files_moved(Look({}, {}), Look({}, read))  # (a read: not yet)
    assert thread_cpu(proc.pid) and all(v >= 0 for v in thread_cpu(proc.pid).values())


def test_a_file_written_without_moving_its_offset_moves(home: Path, tmp_path: Path, processes: dict) -> None:  # noqa: F811
    """A checkpoint writer that puts its bytes down with pwrite (or in one long write call, or
    through a memory map) leaves the file's offset where it was: its size and time move. A file
    held open for writing that nobody writes does not."""
    grows, rewritten, idle = tmp_path / "grows.bin", tmp_path / "rewritten.bin", tmp_path / "idle.bin"
    code = (
        "import os, time\n"
        f"g = os.open({str(grows)!r}, os.O_WRONLY | os.O_CREAT)\n"
        f"r = os.open({str(rewritten)!r}, os.O_RDWR | os.O_CREAT)\n"
        f"i = os.open({str(idle)!r}, os.O_WRONLY | os.O_CREAT)\n"
        "n = 0\nwhile True:\n    os.pwrite(g, b'x' * 4096, n * 4096)\n    os.pwrite(r, b'%08d' % n, 0)\n"
        "    n += 1\n    time.sleep(0.05)\n"
    )
    proc = processes["start"]("pwrite", code)
    time.sleep(0.5)
    skip = str(paths.cluster("c").root)
    first = open_files(proc.pid, skip)
    time.sleep(0.3)
    second = open_files(proc.pid, skip)
    assert {p for _, p in second} == {str(grows), str(rewritten), str(idle)}, second
    assert all(f.offset == 0 and f.writing for f in second.values()), second
    for name in (grows, rewritten, idle):
        only = (
            {k: v for k, v in first.items() if k[1] == str(name)},
            {k: v for k, v in second.items() if k[1] == str(name)},
        )
        assert files_moved(Look({}, only[0]), Look({}, only[1])) is (name != idle), (name, only)
    read = {(3, "/x/data.bin"): Opened(0, False, 10, 1)}
    grown = {(3, "/x/data.bin"): Opened(0, False, 20, 2)}
    assert not files_moved(Look({}, read), Look({}, grown))  # (another grew a file it reads: not its move)


def test_a_process_waiting_for_storage_moves_while_the_node_writes_back(home: Path) -> None:  # noqa: F811
    """A checkpoint that rewrites a file waits in its open() for the old pages to reach the disk
    (state D, nothing of its own moves): it moves while the node writes back, and not when the
    storage it waits on writes nothing (a filesystem that died)."""
    probe = probe_of(["j"])
    key = (1, 0.0)
    p = probe.jobs["j"]
    p.looks, p.moved = {key: Look({1: 1.0}, {})}, time.time()
    waits, runs = Look({1: 1.0}, {}, disk_wait=True), Look({1: 1.0}, {})
    assert probe.judge("py-spy", p, {key: waits}, 3.0, wrote=True) == "io"
    assert probe.judge("py-spy", p, {key: waits}, 3.0, wrote=False) is None
    assert probe.judge("py-spy", p, {key: runs}, 3.0, wrote=True) is None  # (others' writes are not its move)
    assert disk_wait(os.getpid()) is False and pages_written() > 0


def test_a_thread_must_have_run_for_its_values_to_count() -> None:
    before = Look({1: 10.0, 2: 5.0}, {})
    assert before.busy(before, 10.0) == set()
    now = Look({1: 10.05, 2: 5.2, 3: 0.5}, {})
    assert now.busy(before, 10.0) == {2, 3}  # (1 % of 10 s is 0.1 s; a new thread counts whole)
    assert now.busy(before, 1.0) == {1, 2, 3}  # (RUN_MIN: 20 ms)


def test_a_job_never_seen_moving_has_no_evidence() -> None:
    assert JobProgress(1.0).row("node1") == {"host": "node1", "n": 0, "moved": 0.0, "procs": 0}
    assert os.environ.get("RAYSTACK_JOB_ID") is None  # (the test process itself is no job's)


def throttled_cgroup(folder: Path, rate: int) -> Path | None:
    """A blkio cgroup (v1) whose reads and writes to `folder`'s disk go at `rate` bytes a second;
    None where there is none to make (not root, no blkio hierarchy, a folder on no block device)."""
    dev = os.stat(folder).st_dev
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    root = Path("/sys/fs/cgroup/blkio")
    if os.geteuid() != 0 or not block.exists() or not (root / "tasks").exists():
        return None
    disk = (block / "..").resolve() if (block / "partition").exists() else block
    group = root / f"raystack-test-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        for name in ("blkio.throttle.write_bps_device", "blkio.throttle.read_bps_device"):
            (group / name).write_text(f"{(disk / 'dev').read_text().strip()} {rate}\n")
    except OSError:
        return None
    return group


def test_a_checkpoint_rewritten_on_a_slow_disk_is_never_quiet_for_long(
    home: Path,  # noqa: F811
    tmp_path: Path,
    processes: dict,
) -> None:
    """For real, on a disk throttled to 2 MB/s: a loop that rewrites a 16 MiB file spends most of
    its time in its open(), waiting for the old pages to be written (state D); every few seconds
    the probe finds it moving ('io' among the evidence), as the watchdog needs to leave it alone."""
    group = throttled_cgroup(tmp_path, 2 << 20)
    if group is None:
        pytest.skip("needs root and a blkio cgroup for a folder on a block device")
    target = tmp_path / "step.pt"
    code = (
        f"import os\nopen('{group}/tasks', 'w').write(str(os.getpid()))\nblob = b'x' * (16 << 20)\n"
        f"while True:\n    with open({str(target)!r}, 'wb') as fh:\n        fh.write(blob)\n"
    )
    try:
        processes["start"]("slowdisk", code)
        probe = probe_of(["slowdisk"])
        found = looked(probe, ["slowdisk"], 16, every=1.0)["slowdisk"]
    finally:
        for proc in processes["all"].values():
            proc.kill()
            proc.wait()
        group.rmdir()
    assert "io" in found, found
    quiet = max(len(run) for run in "".join("x" if why else "." for why in found[2:]).split("x"))
    assert quiet <= 4, found  # (looks ~1.5 s apart: never 6 s without evidence)
