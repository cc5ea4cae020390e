"""The soak scenario: one cluster runs 40+ jobs unattended while faults are injected, and nothing is
lost, nothing is stuck, nothing runs twice, nothing is left behind. Shared by the CI test
(tests/testbed/test_soak.py, a few minutes) and the benchmark (bench/soak.py, longer, figures).

Allocation 1 of a chain of 2 (4 nodes):
  ok and failing jobs, a flaky job (retries: 1), an actor no node can hold (infeasible), a job
  that hangs (hang_timeout), a job whose working_dir gains a FIFO while it waits, the queue
  runner SIGKILLed twice, the cluster folder's filesystem full for 30 s, readers (`queue --all`,
  `list`, `logs`) in a loop all along; then the head's node program SIGKILLed while a job runs:
  the allocation must end and be released within a minute, the job resume in allocation 2.
Allocation 2: more jobs, and a node SIGKILLed under a job that spans every node: it goes back to
the queue and runs again on the nodes that remain.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raystack import Cluster
from raystack.client import Job
from raystack.errors import ConfigError
from raystack.spec.job import JobSpec
from raystack.store import cluster as clusters
from raystack.store import paths, queue
from raystack.store.ledger import JobState, read_job

REPO = Path(__file__).resolve().parents[2]
DEBUG = REPO / "jobs" / "debug"
TESTBED_DIR = Path(os.environ.get("RAYSTACK_TESTBED_DIR", "/var/lib/raystack-testbed"))
NAME = "soak"
READER_PAUSE = 1.0  # seconds between two calls of one reader
PROFILE = """\
# the testbed profile, with the unattended queue's clocks short enough for a test
description: soak test (testbed with short watchdog clocks)
partition: testbed
time: "01:00:00"
gpus_per_node: 4
cpus_per_task: 4
object_store_memory: 256MB
join_timeout: 120s
join_window: 4
infeasible_grace: 8s
chain: 2
folder_cap: 800M
env:
  RAYSTACK_TESTBED: "1"
  RAYSTACK_SAMPLE_EVERY: "2"
ray_logs: {every: 5s, file_mb: 4, node_mb: 48}
"""


def wait_until(condition: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return value


def processes_of_job(job_id: str) -> list[tuple[int, str]]:
    found = []
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (proc / "environ").read_bytes():
                    cmd = (
                        (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    )
                    if cmd:
                        found.append((int(proc.name), cmd))
    return found


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def slurm_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip() or "GONE"


@dataclass
class Soak:
    """One run of the scenario and what it saw."""

    home: Path
    trace: Path
    scale: float = 1  # ok jobs per phase, times the scenario's (CI: 0.5; bench/soak.py: 3)
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> kind
    figures: dict[str, Any] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    reader_calls: Counter = field(default_factory=Counter)
    reader_failures: list[str] = field(default_factory=list)
    stop_readers: threading.Event = field(default_factory=threading.Event)
    t0: float = field(default_factory=time.monotonic)

    # ------------------------------------------------------------------ jobs
    def command(self, work: str) -> str:
        t = self.trace
        start, end = f'echo "start $RAYSTACK_JOB_ID" >> {t}', f'echo "end $RAYSTACK_JOB_ID $c" >> {t}'
        return f"{start}; {work}; c=$?; {end}; exit $c"

    def submit(self, kind: str, work: str, **fields: Any) -> Job:
        spec = JobSpec(name=f"soak-{kind}", entrypoint=self.command(work), **fields)
        job = Cluster(NAME).submit(spec)
        self.jobs[job.id] = kind
        return job

    def oks(self, n: int) -> list[Job]:
        count = max(1, round(n * self.scale))
        return [self.submit("ok", "python -c 'print(\"soak ok\")'") for _ in range(count)]

    def state(self, job: Job) -> JobState:
        return read_job(NAME, job.id).state

    # ------------------------------------------------------------------ faults
    def runner_pid(self) -> int | None:
        alloc = str(clusters.read(NAME).allocation_id)
        pids = [p for p, cmd in processes_of_job(alloc) if f"-m raystack.allocation.runner {NAME}" in cmd]
        return pids[0] if pids else None

    def kill_runner(self) -> None:
        before = clusters.read(NAME).runner_restarts
        pid = wait_until(self.runner_pid, 60, "the queue runner")
        os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        wait_until(lambda: clusters.read(NAME).runner_restarts > before, 60, "the runner to restart")
        self.faults.append(f"runner SIGKILLed; restarted in {time.monotonic() - t:.1f}s")

    def fill_quota(self, seconds: float) -> None:
        """The cluster folder's filesystem full (a tmpfs of its own: a full quota) for `seconds`."""
        filler = self.home.parent / f"filler-{os.getpid()}"
        with open(filler, "wb") as fh:
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    fh.write(chunk)
                    fh.flush()
            except OSError as exc:
                assert exc.errno in (errno.ENOSPC, errno.EDQUOT), exc
        st = os.statvfs(self.home)
        self.faults.append(f"filesystem full ({st.f_bavail * st.f_frsize} bytes free) for {seconds:.0f}s")
        time.sleep(seconds)
        filler.unlink()

    def kill_head(self) -> float:
        """SIGKILL the head's node program; seconds until SLURM released the allocation and no
        process of it is left on any node."""
        alloc = str(clusters.read(NAME).allocation_id)
        head = parent(wait_until(self.runner_pid, 60, "the queue runner"))
        os.kill(head, signal.SIGKILL)
        t = time.monotonic()
        wait_until(lambda: slurm_state(alloc) not in ("RUNNING", "COMPLETING", "PENDING"), 120, "the release")
        released = time.monotonic() - t
        wait_until(lambda: not processes_of_job(alloc), 120, f"allocation {alloc}'s processes to go")
        gone = time.monotonic() - t
        self.faults.append(
            f"head's node program SIGKILLed: allocation {alloc} released in {released:.1f}s, "
            f"every process gone in {gone:.1f}s"
        )
        self.figures["head_kill_release_s"] = round(released, 1)
        self.figures["head_kill_gone_s"] = round(gone, 1)
        return gone

    def kill_node(self, host: str) -> int:
        alloc = str(clusters.read(NAME).allocation_id)
        killed = 0
        for pid, _ in processes_of_job(alloc):
            with contextlib.suppress(OSError):
                if f"SLURMD_NODENAME={host}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        self.faults.append(f"{host}: {killed} processes of allocation {alloc} SIGKILLed")
        return killed

    # ------------------------------------------------------------------ readers
    def readers(self) -> list[threading.Thread]:
        exe = str(Path(sys.executable).with_name("raystack"))
        verbs = {
            "queue --all": lambda: [exe, "queue", NAME, "--all", "--json"],
            "list": lambda: [exe, "list", "--json"],
            "logs": lambda: [exe, "logs", random.choice(list(self.jobs)), "-c", NAME],
        }

        def loop(verb: str) -> None:
            while not self.stop_readers.is_set():
                if not self.jobs:
                    time.sleep(0.1)
                    continue
                done = subprocess.run(verbs[verb](), capture_output=True, text=True, env=os.environ.copy())
                self.reader_calls[verb] += 1
                if done.returncode != 0:
                    self.reader_failures.append(f"{verb}: {done.returncode}: {done.stderr.strip()[-300:]}")
                self.stop_readers.wait(READER_PAUSE)  # (a person's pace, not the 2 cores' limit)

        threads = [threading.Thread(target=loop, args=(v,), daemon=True) for v in verbs]
        for thread in threads:
            thread.start()
        return threads

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        cluster = Cluster.up(4, profile="soak", name=NAME, chain=2, timeout=300)
        first = str(clusters.read(NAME).allocation_id)
        readers = self.readers()
        oks = self.oks(6)
        fails = [self.submit("fail", "exit 3") for _ in range(3)]
        marker = self.trace.with_name("flaky-marker")
        flaky = self.submit("flaky", f"test -e {marker} || {{ touch {marker}; exit 1; }}", retries=1)
        big = self.submit("infeasible", "python faults.py big --gpus 5", working_dir=str(DEBUG))
        oks += self.oks(4)
        hang = self.submit("hung", "python faults.py hang", working_dir=str(DEBUG), hang_timeout="15s")
        oks += self.oks(4)
        fifo_dir = self.home.parent / "fifo-job"
        fifo_dir.mkdir(exist_ok=True)
        (fifo_dir / "run.py").write_text("print('never')\n")
        fifo = self.submit("fifo", "python run.py", working_dir=str(fifo_dir))
        os.mkfifo(fifo_dir / "pipe")  # after it was queued: the runner must refuse it, not block on it
        try:
            cluster.submit(JobSpec(name="soak-fifo2", entrypoint="true", working_dir=str(fifo_dir)))
            raise AssertionError("a working_dir holding a FIFO was accepted at submit")
        except ConfigError as exc:
            assert "FIFO" in str(exc)
            self.faults.append("a FIFO in a working_dir refused at submit, nothing queued")
        oks += self.oks(3) + [self.submit("fail", "exit 5") for _ in range(2)] + self.oks(3)
        long = self.submit("resumes", "python -c 'import time; time.sleep(25)'")
        wait_until(lambda: self.state(oks[2]).is_terminal(), 300, "the first jobs")
        self.kill_runner()
        wait_until(lambda: self.state(big).is_terminal(), 300, "the infeasible job to end")
        self.kill_runner()
        self.fill_quota(20)
        wait_until(lambda: self.state(long) is JobState.RUNNING, 600, "the long job to run")
        self.kill_head()
        # allocation 2 of the chain: the long job resumes first
        wait_until(lambda: str(clusters.read(NAME).allocation_id) != first, 120, "the next allocation")
        later = self.oks(4) + [self.submit("fail", "exit 7") for _ in range(2)]
        spans = self.submit(
            "node-lost", "python faults.py tick --on node4 --seconds 120", working_dir=str(DEBUG)
        )
        later += self.oks(4)
        wait_until(lambda: self.state(spans) is JobState.RUNNING, 600, "the job on every node")
        wait_until(lambda: any("tick" in ln for ln in self.logs(spans)), 120, "the ticks")
        t, killed = time.monotonic(), time.time()
        self.kill_node("node4")
        wait_until(lambda: self.state(spans).is_terminal(), 240, "the job of the lost node to end")
        self.figures["node_kill_to_job_end_s"] = round(time.monotonic() - t, 1)
        attempts = read_job(NAME, spans.id).attempts  # (issue 68: back in the queue, run on the rest)
        rerun = round(attempts[-1].at - killed, 1) if len(attempts) > 1 else None
        self.figures["node_kill_to_rerun_s"] = rerun
        every = oks + fails + later + [flaky, big, hang, fifo, long, spans]
        for job in every:
            wait_until(lambda j=job: self.state(j).is_terminal(), 600, f"job {job.id} to end")
        self.stop_readers.set()
        for thread in readers:
            thread.join(60)
        allocations = [a.alloc_id for a in clusters.read(NAME).allocations]
        cluster.down()
        return self.verdict(
            allocations,
            {"flaky": flaky, "big": big, "hang": hang, "fifo": fifo, "long": long, "spans": spans},
        )

    def logs(self, job: Job) -> list[str]:
        try:
            return job.logs().splitlines()
        except OSError:
            return []

    # ------------------------------------------------------------------ the verdict
    def verdict(self, allocations: list[str], named: dict[str, Job]) -> dict[str, Any]:
        """Every check of the issue's pass line; the figures of the run."""
        p = paths.cluster(NAME)
        trace = self.trace.read_text().split("\n") if self.trace.exists() else []
        starts = Counter(ln.split()[1] for ln in trace if ln.startswith("start "))
        ends = Counter(ln.split()[1] for ln in trace if ln.startswith("end "))
        records = {j: read_job(NAME, j) for j in self.jobs}
        lost = [j for j, r in records.items() if not r.state.is_terminal()]
        terminal_twice = [
            j for j, r in records.items() if sum(JobState(h["state"]).is_terminal() for h in r.history) != 1
        ]
        ran_twice = [
            j for j, r in records.items() if starts[j] > len(r.attempts) or ends[j] > max(1, len(r.attempts))
        ]
        left = {a: processes_of_job(a) for a in allocations}
        alive = [a for a in allocations if slurm_state(a) in ("RUNNING", "PENDING", "COMPLETING")]
        by_state = Counter(r.state.value for r in records.values())
        self.figures.update(
            jobs=len(records),
            by_state=dict(by_state),
            lost=len(lost),
            terminal_twice=len(terminal_twice),
            ran_twice=len(ran_twice),
            allocations=allocations,
            left_in_slurm=alive,
            left_on_nodes={a: len(v) for a, v in left.items() if v},
            reader_calls=dict(self.reader_calls),
            reader_failures=len(self.reader_failures),
            corrupt=sorted(x.name for x in p.corrupt.iterdir()) if p.corrupt.exists() else [],
            queue_left=len(queue.waiting(NAME)) + len(queue.active(NAME)),
            faults=self.faults,
            messages={k: read_job(NAME, j.id).message[:1000] for k, j in named.items()},
            seconds=round(time.monotonic() - self.t0, 1),
        )
        spans = records[named["spans"].id]
        self.figures["spans_state"], self.figures["spans_attempts"] = spans.state.value, len(spans.attempts)
        interrupted = [h["message"] for h in spans.history if h["state"] == "INTERRUPTED"]
        self.figures["spans_interrupted"] = interrupted
        for kind in ("infeasible", "hung"):
            job = next(j for j, k in self.jobs.items() if k == kind)
            r = records[job]
            if r.started and r.ended:
                self.figures[f"{kind}_stuck_s"] = round(r.ended - r.started, 1)
        self.figures["problems"] = {
            "lost": lost,
            "terminal_twice": terminal_twice,
            "ran_twice": ran_twice,
            "reader_failures": self.reader_failures[:5],
        }
        return self.figures


def prepare(root: Path, scale: float = 1, setenv: Any = os.environ.__setitem__) -> Soak:
    """RAYSTACK_HOME on the testbed's small filesystem, the soak profile, a trace outside it."""
    quota = TESTBED_DIR / "quota"
    if not os.path.ismount(quota):
        raise RuntimeError(f"{quota} is not a mount: restart the testbed (slurm/testbed/down; up)")
    home = quota / f"soak-{os.getpid()}" / "rs"
    shutil.rmtree(home.parent, ignore_errors=True)
    home.mkdir(parents=True)
    profiles = root / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "soak.yaml").write_text(PROFILE)
    setenv("RAYSTACK_HOME", str(home))
    setenv("RAYSTACK_PROFILE_PATH", str(profiles))
    trace = root / "trace"
    trace.write_text("")
    return Soak(home=home, trace=trace, scale=scale)


def cleanup(soak: Soak) -> None:
    for name in ("soak",):
        with contextlib.suppress(Exception):
            Cluster(name).down()
    shutil.rmtree(soak.home.parent, ignore_errors=True)


def summary(figures: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in figures.items() if k != "problems"}, indent=1)
