"""Local mode (`raystack up --local`): the node program on this machine as a one-node cluster,
without SLURM — the same folder, token, queue, ledger and CLI. Driven through the CLI as a user
would; GPUs are logical here (as on the testbed), which is enough for placement and masking."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack.adapters import local
from raystack.adapters.allocator import allocator

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
DEBUG = REPO / "jobs" / "debug"


def rs(
    home: Path, *args: str, check: bool = True, timeout: float = 300, shell: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_"))}
    env.update(
        RAYSTACK_HOME=str(home), SLURM_JOB_ID="4242", SLURM_NODELIST="elsewhere"
    )  # a stray SLURM shell
    env.update(shell or {})
    proc = subprocess.run(
        [sys.executable, "-m", "raystack.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"raystack {' '.join(args)} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc


def record(home: Path, name: str = "local") -> dict:
    return json.loads((home / "clusters" / name / "cluster.json").read_text())


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def left_behind(job_id: str) -> list[int]:
    return local.pids(job_id, everything=True) or []


@pytest.fixture(scope="module")
def lc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    home = tmp_path_factory.mktemp("home")
    started = time.monotonic()
    up = rs(home, "up", "--local", "--gpus", "2", "--cpus", "2", "--json")
    info = {"home": home, "up": json.loads(up.stdout), "ready_s": time.monotonic() - started}
    try:
        yield info
    finally:
        rs(home, "down", "local", check=False)
        local.sweep(info["up"]["allocation_id"])


def test_up_local_is_ready_with_what_was_asked_and_nothing_public(lc: dict) -> None:
    rec = lc["up"]
    assert rec["state"] == "READY" and rec["backend"] == "local"
    assert local.host_of(rec["allocation_id"]) == local.this_host()
    assert rec["nodes_expected"] == 1 and rec["gpus_per_node"] == 2 and rec["cpus_per_node"] == 2
    assert rec["memory_per_node"] > 2**28  # (Ray's memory resource of the node: what a driver may ask)
    assert rec["dashboard_url"].startswith("http://127.0.0.1:")
    token = lc["home"] / "clusters" / "local" / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    status = json.loads(rs(lc["home"], "status", "local", "--json").stdout)
    assert status["ready"] and status["gpus"] == 2 and status["cpus"] == 2
    assert "lost" not in status["message"]
    # `raystack dashboard`: the URL that opens here (the tunnel's loopback address, from elsewhere)
    dash = json.loads(rs(lc["home"], "dashboard", "local", "--json").stdout)
    assert dash["url"] == rec["dashboard_url"] and dash["tunnel_url"].startswith("http://127.0.0."), dash
    # The dashboard (Jobs API) answers on loopback only.
    port = rec["ports"]["dashboard"]
    public = [ip for ip in {socket.gethostbyname(socket.gethostname())} if not ip.startswith("127.")]
    for ip in public:
        with socket.socket() as sock:
            sock.settimeout(2)
            assert sock.connect_ex((ip, port)) != 0, f"dashboard reachable on {ip}:{port}"


def test_jobs_run_through_the_queue_with_their_own_gpus(lc: dict) -> None:
    home = lc["home"]
    ids = []
    for spec, sets in (
        ("hello.yaml", []),
        ("placement.yaml", []),
        ("spmd.yaml", ["--set", "procs_per_node=2"]),
    ):
        out = rs(home, "submit", str(DEBUG / spec), *sets, "--json")
        ids.append(json.loads(out.stdout)["id"])
    for job_id in ids:
        follow = rs(home, "logs", job_id, "-f", check=False, timeout=600)
        assert follow.returncode == 0, f"{job_id}: {follow.stdout[-3000:]}"
    jobs = {r["id"]: r for r in json.loads(rs(home, "queue", "local", "--all", "--json").stdout)}
    assert all(jobs[j]["state"] == "SUCCEEDED" for j in ids)
    spmd_log = rs(home, "logs", ids[2]).stdout
    ranks = [
        json.loads(line.split("SPMD_RANK ", 1)[1]) for line in spmd_log.splitlines() if "SPMD_RANK " in line
    ]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["world"] for r in ranks} == {2}
    hello = rs(home, "logs", ids[0]).stdout
    assert "SLURM_JOB_ID" not in hello  # jobs do not think they run inside SLURM
    env = Path(f"/proc/{local.pids(lc['up']['allocation_id'])[0]}/environ").read_bytes()  # type: ignore[index]
    assert b"SLURM_JOB_ID=" not in env


def test_a_working_dir_whose_gitignore_ray_cannot_read_runs(lc: dict, tmp_path: Path) -> None:
    """A `!` line (git skips it; Ray 2.60's packager fails on it with IndexError): submit warns
    naming the line, and the job runs with what git would upload (data/ left out)."""
    wd = tmp_path / "repo"
    (wd / "data").mkdir(parents=True)
    (wd / "data" / "big.txt").write_text("x")
    (wd / "main.py").write_text("import os\nprint('FILES', sorted(os.listdir('.')))\n")
    (wd / ".gitignore").write_text("data/\n!\n")
    out = rs(lc["home"], "submit", "--working-dir", str(wd), "--json", "--", "python", "main.py")
    assert f"{wd / '.gitignore'} line 2: '!' is not a pattern git uses" in out.stderr, out.stderr
    job_id = json.loads(out.stdout)["id"]
    follow = rs(lc["home"], "logs", job_id, "-f", check=False, timeout=300)
    assert follow.returncode == 0, follow.stdout[-3000:]
    assert "FILES ['.gitignore', 'main.py']" in follow.stdout, follow.stdout[-2000:]


def test_a_second_local_cluster_of_the_same_name_is_refused(lc: dict) -> None:
    again = rs(lc["home"], "up", "--local", "--cpus", "1", check=False)
    assert again.returncode == 1 and "in use by a live cluster" in again.stderr


def test_bad_local_requests_are_refused_before_anything_starts(tmp_path: Path) -> None:
    for args, field in (
        (["--nodes", "2"], "--nodes"),
        (["--partition", "gpu"], "--partition"),
        (["--cpus", "100000"], "--cpus"),
        (["--gpus-per-node", "1"], "--gpus-per-node"),
    ):
        proc = rs(tmp_path, "up", "--local", *args, check=False)
        assert proc.returncode == 1 and field in proc.stderr, proc.stderr
    assert not (tmp_path / "clusters").exists() or not any((tmp_path / "clusters").iterdir())


def test_down_stops_exactly_its_processes_and_a_killed_one_is_found_and_swept(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A SIGKILLed node program (it cannot stop its Ray): the first command that sees it gone
    settles and sweeps it as SLURM would an ended allocation: its running job's driver is killed
    (it ran on as an orphan until `down`), Ray's temp folder removed, `status` says FAILED with no
    job running; every reader (`job`, `job --json`, `queue --json`, `logs -f`) says the job is
    INTERRUPTED (queue said FAILED while `job` said RUNNING), `down` says so and leaves it queued,
    and the next `up` resumes it (RAYSTACK_RESUME=1); a SIGTERM to the node program (a shutdown, a
    plain `kill`) interrupts it the same way."""
    home = tmp_path_factory.mktemp("kill")
    rec = json.loads(rs(home, "up", "--local", "--cpus", "1", "--name", "k", "--json").stdout)
    job_id = rec["allocation_id"]
    assert left_behind(job_id)
    temp = list(
        local.temp_prefix(job_id, local.scratch()).parent.glob(
            f"{local.temp_prefix(job_id, local.scratch()).name}-*"
        )
    )
    assert len(temp) == 1 and temp[0].is_dir(), temp
    sleeper = (
        "import os, time; print('SLEEPING', os.environ.get('RAYSTACK_RESUME'), flush=True); time.sleep(600)"
    )
    job = json.loads(rs(home, "submit", "-c", "k", "--json", "--", "python", "-c", sleeper).stdout)["id"]
    deadline = time.monotonic() + 120
    while (
        b"SLEEPING" not in b"".join(cmdline(p) for p in left_behind(job_id)) and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    drivers = [p for p in left_behind(job_id) if b"SLEEPING" in cmdline(p)]
    assert drivers
    for pid in local.pids(job_id) or []:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while local.alive(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    status = json.loads(rs(home, "status", "k", "--json", check=False).stdout)
    assert status["state"] == "FAILED" and "no longer running" in status["message"], status
    assert status["running_job"] is None, status
    said = {
        "job": json.loads(rs(home, "job", job, "--json").stdout)["state"],
        "queue": {r["id"]: r for r in json.loads(rs(home, "queue", "k", "--all", "--json").stdout)}[job][
            "state"
        ],
    }
    follow = rs(home, "logs", job, "-f", check=False, timeout=60)
    assert said == {"job": "INTERRUPTED", "queue": "INTERRUPTED"}, said
    assert follow.returncode == 1 and f"job {job} INTERRUPTED" in follow.stderr, follow.stderr
    assert not [p for p in drivers if cmdline(p)], "the job's driver outlived its cluster"
    assert not temp[0].exists(), "Ray's temp folder was left"
    text = rs(home, "status", "k", check=False).stdout
    assert "slurm" not in text and f"{job_id} ENDED" in text, text
    # What may be left after that (a process that inherited the id later): `down` sweeps it too...
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, local.ENV_ID: job_id}
    )
    deadline = time.monotonic() + 10  # (its environment is the new one once it has exec'd)
    while orphan.pid not in left_behind(job_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphan.pid in left_behind(job_id)
    # ... but not its queue runner, which would go on taking jobs off the queue.
    assert not [pid for pid in left_behind(job_id) if b"raystack.allocation.runner" in cmdline(pid)]
    # ... and `down` leaves nothing of it, and says what became of the job.
    down = rs(home, "down", "k")
    assert f"ended before it (INTERRUPTED): {job}" in down.stderr and "STOPPED" not in down.stderr, (
        down.stderr
    )
    deadline = time.monotonic() + 30
    while left_behind(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left_behind(job_id)
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    ledger = json.loads(rs(home, "job", job, "--json").stdout)
    assert ledger["state"] == "INTERRUPTED" and ledger["attempts"] == 1, ledger
    # The next `up` resumes it; a SIGTERM to the node program interrupts it again.
    again = json.loads(rs(home, "up", "--local", "--cpus", "1", "--name", "k", "--json").stdout)[
        "allocation_id"
    ]
    deadline = time.monotonic() + 120
    while "SLEEPING 1" not in rs(home, "logs", job).stdout and time.monotonic() < deadline:
        time.sleep(0.5)
    assert json.loads(rs(home, "job", job, "--json").stdout)["state"] == "RUNNING"
    for pid in local.pids(again) or []:
        if b"raystack.allocation.node" in cmdline(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while local.alive(again) and time.monotonic() < deadline:
        time.sleep(0.2)
    ledger = json.loads(rs(home, "job", job, "--json").stdout)
    assert ledger["state"] == "INTERRUPTED" and ledger["attempts"] == 2, ledger
    rs(home, "down", "k", check=False)


def test_local_ids_and_hosts() -> None:
    alloc_id = local.new_id()
    assert local.host_of(alloc_id) == local.this_host() and local.alive(alloc_id) is False
    assert local.alive("local-some-other-host-00000000") is None  # another host: cannot tell
    assert allocator("local").info("local-some-other-host-00000000") is None  # never a guess


def test_a_tls_local_cluster_runs_jobs_and_serves_ray_status(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Ray swaps the 127.0.0.1 it is given for the host's address: the node certificate names
    every address of the machine, or nothing connects."""
    home = tmp_path_factory.mktemp("tls")
    rec = json.loads(rs(home, "up", "--local", "--tls", "--cpus", "1", "--name", "t", "--json").stdout)
    try:
        assert rec["tls"] and rec["dashboard_url"].startswith("https://127.0.0.1:")
        code = "import ray; ray.init(); print('SUM', ray.get(ray.remote(lambda: 40 + 2).remote()))"
        done = rs(home, "submit", "--cluster", "t", "--follow", "--", "python", "-c", code)
        assert "SUM 42" in done.stdout
        exports = json.loads(rs(home, "env", "t", "--json").stdout)
        ray_cli = str(Path(sys.executable).with_name("ray"))
        status = subprocess.run(
            [ray_cli, "status"], capture_output=True, text=True, timeout=60, env={**os.environ, **exports}
        )
        # (x/1.0: the last task's worker may hold its CPU a moment longer)
        assert status.returncode == 0 and "/1.0 CPU" in status.stdout, status.stderr
        # top reads Ray's node stats through the HTTPS front, checked against the cluster's CA
        top = rs(home, "top", "t", "--once", "--json")
        view = json.loads(top.stdout)
        assert top.returncode == 0 and len(view["nodes"]) == 1 and view["nodes"][0]["mem_total"] > 0, (
            top.stderr
        )
    finally:
        rs(home, "down", "t")
    assert not Path(f"/dev/shm/rs-tls-{os.getuid()}-{rec['allocation_id']}").exists()


def test_up_in_a_shell_that_has_another_clusters_env_gets_ready(tmp_path: Path) -> None:
    """`eval "$(raystack env other)"`, then `ID=$(raystack up --parsable)` in the same shell: the new
    cluster's node program must not use the other cluster's address and token (it never saw its
    own node join, and failed after the join timeout)."""
    home, token = tmp_path / "home", tmp_path / "other-token"
    token.write_text("another-clusters-token-0123456789\n")
    token.chmod(0o600)
    other = {
        "RAY_ADDRESS": "127.0.0.1:9", "RAY_API_SERVER_ADDRESS": "http://127.0.0.1:9",
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAYSTACK_CLUSTER": "other",
    }  # fmt: skip
    up = rs(home, "up", "--local", "--name", "fresh", "--cpus", "1", "--parsable", timeout=180, shell=other)
    try:  # (--parsable: the allocation's id alone on stdout, as sbatch --parsable prints the job's)
        assert up.stdout.strip() == record(home, "fresh")["allocation_id"], up.stdout + up.stderr[-2000:]
        assert record(home, "fresh")["state"] == "READY", up.stderr[-2000:]
    finally:
        rs(home, "down", "fresh", check=False)
