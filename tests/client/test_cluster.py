"""Cluster API logic that needs no SLURM: waiting with an injected clock, records, name lookup."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.adapters import slurm
from raystack.adapters.slurm import parse
from raystack.client.pending import pending_line
from raystack.errors import ClusterError
from raystack.store import claims
from raystack.store import cluster as clusters
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.waiting import Clock, FakeClock


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    return tmp_path


def test_wait_ready_gives_up_after_timeout_without_waiting(home: Path) -> None:
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.STARTING, nodes_expected=4, nodes_joined=1))
    clock, said = FakeClock(0.0), []
    with pytest.raises(ClusterError, match=r"not READY after 30s \(STARTING: .*raystack down c"):
        Cluster("c").wait_ready(progress=said.append, timeout=30, clock=clock)
    assert said == ["STARTING: 1/4 nodes joined"]  # said once, not every poll
    assert 30 < clock.t < 31


def test_wait_ready_returns_once_ready_and_reports_progress(home: Path) -> None:
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.STARTING, nodes_expected=2))
    clock, said = FakeClock(0.0), []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        joined = min(2, int(clock.t))
        changes = {"nodes_joined": joined, **({"state": ClusterState.READY} if clock.t > 3 else {})}
        clusters.update("c", **changes)

    record = Cluster("c").wait_ready(progress=said.append, clock=Clock(now=clock.now, sleep=sleep))
    assert record.state is ClusterState.READY
    assert said == [f"STARTING: {k}/2 nodes joined" for k in range(3)]


@pytest.mark.parametrize("output_seen", [False, True])
def test_wait_ready_says_once_when_the_nodes_do_not_see_the_cluster_folder(
    home: Path, monkeypatch: pytest.MonkeyPatch, output_seen: bool
) -> None:
    """RAYSTACK_HOME on /tmp: the allocation runs, but its head writes into the nodes' own /tmp
    and `up` would wait in silence for ever. SLURM opens the allocation's output file in the
    cluster folder as it starts: not seeing it here after a minute says why."""
    from raystack.store import paths

    clusters.create("c")
    clusters.write(
        ClusterRecord(name="c", state=ClusterState.SUBMITTED, allocation_id="77", nodes_expected=2)
    )
    started = int(time.time()) - 90
    monkeypatch.setattr(
        slurm,
        "job_info",
        lambda alloc_id: parse.answer(alloc_id, "RUNNING", nodes="n[1-2]", start_time=started),
    )
    if output_seen:  # (setup lines still running: nothing to say)
        out = paths.cluster("c").allocation_log("77")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("loading modules\n")
    clock, said = FakeClock(0.0), []
    with pytest.raises(ClusterError, match="not READY after 60s"):
        Cluster("c").wait_ready(progress=said.append, timeout=60, clock=clock)
    warned = [m for m in said if m.startswith("warning:")]
    status = Cluster("c").status().message  # (`up --no-wait`, then `raystack status`)
    assert ("its nodes do not see RAYSTACK_HOME" in status) is not output_seen, status
    if output_seen:
        assert warned == [], said
    else:
        assert len(warned) == 1, said
        ran = r"SLURM job 77 has run for 1m3\ds on n\[1-2\], but its output \S+ is not here"
        assert re.search(ran, warned[0]), warned
        assert f"its nodes do not see RAYSTACK_HOME ({home / 'rs'})" in warned[0]


def test_a_pending_reason_that_never_clears_is_said_with_its_fix(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PartitionTimeLimit (an allocation submitted by hand, or where sinfo did not answer): SLURM
    keeps it PENDING for ever; `up`, `wait` and `status` say so, and what to change."""
    from raystack.adapters.allocator import allocator

    clusters.create("c")
    clusters.write(
        ClusterRecord(name="c", state=ClusterState.SUBMITTED, allocation_id="77", nodes_expected=2)
    )
    reason = "PartitionTimeLimit"
    monkeypatch.setattr(slurm, "job_info", lambda alloc_id: parse.answer(alloc_id, "PENDING", reason=reason))
    clock, said = FakeClock(0.0), []
    with pytest.raises(ClusterError, match="not READY after 30s"):
        Cluster("c").wait_ready(progress=said.append, timeout=30, clock=clock)
    fix = (
        "it never starts (the walltime is over the partition's limit (sinfo)): `raystack down c`, "
        "then up with a shorter --time, and --chain N"
    )
    assert said == [f"PENDING in SLURM (job 77, reason: PartitionTimeLimit); {fix}"], said
    assert Cluster("c").status().message.startswith(fix)
    reason = "Priority"  # (clears as other jobs end: nothing more is said)
    allocator("slurm").forget()
    assert "never starts" not in Cluster("c").status().message


def test_wait_ready_raises_with_the_reason_and_logs_when_the_start_failed(home: Path) -> None:
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.FAILED, message="node node3 did not join"))
    with pytest.raises(ClusterError, match=r"cluster c FAILED: node node3 did not join \(logs: .*/c/logs\)"):
        Cluster("c").wait_ready(timeout=5)


def test_state_history_records_every_change_once(home: Path) -> None:
    clusters.create("c")
    clusters.write(ClusterRecord(name="c"))
    for state in (ClusterState.STARTING, ClusterState.STARTING, ClusterState.READY):
        clusters.update("c", state=state)
    assert [h["state"] for h in clusters.read("c").history] == ["STARTING", "READY"]


def test_name_resolution(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    with pytest.raises(ClusterError, match=r"no clusters in .*raystack up --nodes N"):
        clusters.resolve(None)
    for name, state in (("a", ClusterState.STOPPED), ("b", ClusterState.READY)):
        clusters.create(name)
        clusters.write(ClusterRecord(name=name, state=state))
    assert clusters.resolve(None) == "b"  # the only live one
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.READY))
    with pytest.raises(ClusterError, match=r"several clusters \(b, c\)"):
        clusters.resolve(None)
    with pytest.raises(ClusterError, match=r"no cluster named 'zz'.*start one with"):
        Cluster.get("zz")
    with pytest.raises(ClusterError, match=r"no cluster named 'bb' .*: did you mean 'b'\? \(known: a, b, c;"):
        Cluster.get("bb")  # (a typo of a known name)
    # A record that still says READY but whose allocation SLURM says ended is not live: its head
    # could not record the end (SIGKILL), and `raystack down` alone means the other one.
    clusters.update("c", allocation_id="77")
    monkeypatch.setattr(slurm, "job_info", lambda alloc_id: parse.answer(alloc_id, "TIMEOUT"))
    assert Cluster.get().name == "b"
    with pytest.raises(ClusterError, match=r"several clusters \(b, c\)"):
        clusters.resolve(None)  # (the store alone reads the records as they are)


def test_env_of_a_tls_cluster_names_its_client_certificate_and_ca(home: Path) -> None:
    from raystack.store import tls

    clusters.create("t")
    tls.create_ca("t")
    clusters.write(
        ClusterRecord(name="t", gcs_address="10.0.0.1:1", dashboard_url="https://10.0.0.1:2", tls=True)
    )
    env = Cluster.get("t").env()
    assert env["RAY_USE_TLS"] == "1" and env["RAY_API_SERVER_ADDRESS"].startswith("https://")
    for key in ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT"):
        assert Path(env[key]).is_file() and Path(env[key]).parent == tls.folder("t")
    clusters.write(ClusterRecord(name="t", gcs_address="10.0.0.1:1", dashboard_url="http://10.0.0.1:2"))
    assert "RAY_USE_TLS" not in Cluster.get("t").env()


def test_one_unreadable_record_does_not_hide_the_other_clusters(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("a", "b"):
        clusters.create(name)
        clusters.write(ClusterRecord(name=name, state=ClusterState.READY))
    record = clusters.paths.cluster("b").record
    record.write_text('{"name": "b", "state": ')  # (a write cut short)
    assert [r.name for r in Cluster.list()] == ["a"]
    assert "the record of cluster 'b' cannot be read" in caplog.text and str(record) in caplog.text
    assert record.read_text() == '{"name": "b", "state": '  # left where it is, as it is
    assert clusters.resolve(None) == "a"  # the only readable live one
    # The error says how out: repair it, or end the newest allocation (from its logs) and remove it.
    logs = clusters.paths.cluster("b").logs
    logs.mkdir(parents=True, exist_ok=True)
    for n, alloc in enumerate(("88", "123")):
        (logs / f"allocation-{alloc}.log").write_text("")
        os.utime(logs / f"allocation-{alloc}.log", (1000 + n, 1000 + n))
    with pytest.raises(clusters.UnreadableRecord) as told:
        clusters.read("b")
    assert str(told.value).endswith(
        f"it is left at {record}: repair it (it is JSON), or end the cluster by hand (its newest "
        f"allocation: 123) and remove {record.parent}"
    ), told.value


@pytest.mark.parametrize("printed", [True, False])
def test_an_allocation_whose_script_failed_before_the_cluster_started_says_what_it_printed(
    home: Path, monkeypatch: pytest.MonkeyPatch, printed: bool
) -> None:
    """A site's setup line that fails (`module load` where there is no `module`) ends the allocation
    before the head writes anything: the record says SLURM's reason and the script's last words,
    at the launch script's line, not just "FAILED"."""
    from raystack.store import paths

    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.SUBMITTED, allocation_id="77"))
    folder = paths.cluster("c")
    if printed:
        folder.allocation_log("77").write_text(
            "\x1b[0mraystack allocation 77\n/var/spool/slurmd/job00077/slurm_script: line 24: "
            "module: command not found\n\n"
        )
    monkeypatch.setattr(
        slurm, "job_info", lambda alloc_id: parse.answer(alloc_id, "FAILED", reason="NonZeroExitCode")
    )
    record = Cluster("c").status()
    assert record.state == "FAILED"
    said = f"NonZeroExitCode before the cluster started: {folder.script}: line 24: module: command not found"
    if printed:
        assert said in record.message
    else:
        assert "FAILED, NonZeroExitCode before the cluster started)" in record.message
    assert clusters.read("c").state is ClusterState.SUBMITTED  # (status only looks)


def test_a_mistyped_job_id_is_answered_with_the_closest_one(home: Path) -> None:
    from raystack import Job
    from raystack.store import queue
    from raystack.store.ledger import JobRequest

    for name in ("a", "b"):
        clusters.create(name)
        clusters.write(ClusterRecord(name=name, state=ClusterState.READY))
    queue.enqueue(JobRequest(id="train-3f9c2a71", name="train", cluster="b", entrypoint="true"))
    with pytest.raises(
        ClusterError, match=r"no job 'train-3f9c2a7l' .*\(did you mean train-3f9c2a71 in cluster b\?\)"
    ):
        Job.get("train-3f9c2a7l")
    with pytest.raises(ClusterError, match=r"no job 'eval-1' in any cluster in \S+: list jobs"):
        Job.get("eval-1")  # (nothing close: no guess)
    with pytest.raises(ClusterError, match=r"\(did you mean train-3f9c2a71 in cluster b\?\)"):
        Job.get("train")  # (a job's name, as `raystack queue` shows it: its id)
    queue.enqueue(JobRequest(id="train-00c0ffee", name="train", cluster="b", entrypoint="true"))
    with pytest.raises(ClusterError, match=r"\(train is a name; its jobs: train-00c0ffee, train-3f9c2a71\)"):
        Job.get("train")
    assert Job.get("train-3f9c2a71").cluster == "b"
    for k in (1, 2, 10):  # a sweep's jobs: <sweep>-<k>
        queue.enqueue(JobRequest(id=f"lr-0a1b2c-{k}", name="lr", cluster="a", entrypoint="true"))
    with pytest.raises(
        ClusterError,
        match=r"lr-0a1b2c is a sweep of 3 job\(s\) in cluster a \(lr-0a1b2c-1 ... lr-0a1b2c-10\)",
    ):
        Job.get("lr-0a1b2c")
    # A single job whose 8 hex digits happen to be all decimal is no sweep of its name (one id in
    # 43 is so): `raystack job tick` and `cancel tick` took it for a sweep of one.
    from raystack.client.job import Sweep

    queue.enqueue(JobRequest(id="tick-95270545", name="tick", cluster="a", entrypoint="true"))
    with pytest.raises(ClusterError, match=r"no job 'tick' .*\(did you mean tick-95270545 in cluster a\?\)"):
        Job.get("tick")
    assert Sweep.get("tick") is None
    queue.enqueue(JobRequest(id="lr-0a1b2c-0", name="lr", cluster="a", entrypoint="true"))
    assert Sweep.get("lr-0a1b2c") is not None and len(Sweep.get("lr-0a1b2c").job_ids) == 4  # (k from 0)


def test_a_job_whose_ledger_was_set_aside_is_named_not_lost(home: Path) -> None:
    """An unreadable ledger is moved into corrupt/ by the runner; `queue` and `job ID` say where,
    instead of the job vanishing from every listing."""
    from raystack import Job
    from raystack.store import paths, queue
    from raystack.store.files import quarantine
    from raystack.store.ledger import JobRequest

    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.READY))
    for job_id in ("a-1", "b-2"):
        queue.enqueue(JobRequest(id=job_id, name=job_id[0], cluster="c", entrypoint="true"))
    folder = paths.cluster("c")
    folder.ledger("b-2").write_text('{"id": "trunc')
    moved = quarantine(folder, folder.ledger("b-2"), "not JSON")
    assert moved is not None
    view = Cluster("c").queue(every=True)
    assert [r.id for r in view.records] == ["a-1"] and view.set_aside == {"b-2": moved}
    assert Cluster("c").queue().set_aside == {"b-2": moved}
    with pytest.raises(
        ClusterError, match=rf"job b-2 of cluster c: .*set aside as {moved}; raystack no longer"
    ):
        Job.get("b-2")


def test_slurms_start_estimate_is_said_once_it_has_one() -> None:
    from raystack.client.pending import expected_start

    now = 1_800_000_000.0
    assert expected_start(None, now) == "" and expected_start(0, now) == ""  # no estimate yet (N/A)
    assert expected_start(int(now) - 60, now) == ""  # a past estimate says nothing
    soon = expected_start(int(now) + 3900, now)
    assert soon.startswith(", SLURM expects it to start at ") and soon.endswith(", in 1h5m"), soon
    later = expected_start(int(now) + 3 * 86400, now, countdown=False)
    day = time.strftime("%d %b", time.localtime(now + 3 * 86400))
    assert day in later and ", in" not in later, later  # days away: with the date; no countdown
    year_on = now + 365 * 86400  # (behind a job without a time limit SLURM says a year)
    far = expected_start(int(year_on), now)
    assert time.strftime("%d %b %Y", time.localtime(year_on)) in far and far.endswith(", in 365d"), far


def test_a_pending_allocation_is_said_again_only_when_its_reason_or_estimate_really_moves() -> None:
    from raystack.client.pending import PendingShown

    shown = PendingShown()

    def pending(reason: str, start: int = 0) -> bool:
        return shown.moved(parse.answer("7", "PENDING", reason=reason, start_time=start))

    assert pending("Priority")  # the first word
    assert not pending("Priority")
    assert pending("Priority", 10_000)  # SLURM's first estimate
    assert not pending("Priority", 10_000 + 120)  # backfill revising it by two minutes
    assert pending("Priority", 10_000 + 900)  # by a quarter of an hour
    assert pending("Resources", 10_900)  # a new reason
    assert pending("Resources")  # the estimate withdrawn


def test_status_of_a_ready_cluster_missing_a_node_says_so(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record said `READY 2 nodes, 8 GPUs ready` while Ray had 1 (a worker's raylet killed)."""
    from raystack.adapters.ray import NodeSummary
    from raystack.client import status

    clusters.create("c")
    clusters.write(
        ClusterRecord(
            name="c",
            state=ClusterState.READY,
            allocation_id="77",
            nodes_expected=2,
            dashboard_url="http://10.0.0.1:8265",
            message="2 nodes, 8 GPUs ready",
        )
    )
    monkeypatch.setattr(slurm, "job_info", lambda alloc_id: parse.answer(alloc_id, "RUNNING"))

    class OneNode:
        def alive_nodes(self, timeout: float) -> list[NodeSummary]:
            return [NodeSummary("n1", "10.0.0.1", True, {"GPU": 4.0, "CPU": 4.0})]

    monkeypatch.setattr(status, "live_dashboard", lambda record, info=None: OneNode())
    st = Cluster("c").status()
    assert not st.ready and st.nodes_alive == 1
    assert st.message.startswith("1 of 2 nodes in Ray now: a node's Ray left") and "node-*.log" in st.message


def test_an_up_interrupted_before_its_allocation_id_ends_the_cluster_for_every_reader(home: Path) -> None:
    # `raystack up` stopped in sbatch (Ctrl-C while slurmctld hangs): SUBMITTED, no allocation id.
    claims.begin("c", nodes_expected=1, gpus_per_node=4, cpus_per_node=16)
    assert Cluster("c").record().state is ClusterState.SUBMITTED  # (its up still runs: this process)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    clusters.update("c", submitter=f"{socket.gethostname()}:{gone.stdout.strip()}")
    seen = Cluster("c").record()  # (a reader: shown ended, nothing written)
    assert (
        seen.state is ClusterState.FAILED
        and "stopped before the allocation's id was recorded" in seen.message
    )
    assert clusters.read("c").state is ClusterState.SUBMITTED
    clock = FakeClock(0.0)
    with pytest.raises(ClusterError, match=r"cluster c FAILED: its `raystack up` stopped"):
        Cluster("c").wait_ready(timeout=60, clock=clock)
    assert clock.t == 0  # (said at once, not after the timeout)
    with pytest.raises(ClusterError, match=r"cluster c is FAILED \(its `raystack up` stopped"):
        Cluster.get("c").submit(["python", "x.py"])  # (no job queued for an allocation that never comes)
    assert clusters.read("c").state is ClusterState.FAILED and not Cluster("c").jobs()


def test_an_allocation_waiting_for_drained_nodes_says_which_and_how_many_run_jobs(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shim = tmp_path / "bin"
    shim.mkdir()
    fixture = Path(__file__).parents[1] / "fixtures" / "slurm" / "sinfo-nodes-states.txt"
    (shim / "sinfo").write_text(f"#!/bin/sh\ncat {fixture}\n")
    (shim / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    record = ClusterRecord(name="big", nodes_expected=4, request={"name": "raystack-big", "queue": "testbed"})
    # (a record an earlier version wrote kept sbatch's options: its partition is read from them)
    legacy = ClusterRecord(name="big", nodes_expected=4, sbatch_options=["--nodes=4", "--partition=testbed"])
    reason = "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"
    line = pending_line(record, parse.answer("11", "PENDING", reason=reason))
    assert pending_line(legacy, parse.answer("11", "PENDING", reason=reason)) == line
    assert line.endswith(
        f"reason: {reason}); partition testbed: node3 down (bad dimm), node4 drained (maintenance); 2 of its "
        "nodes can run jobs now, and it asks 4: it starts when enough return, or `raystack down big` and up "
        "with --nodes 2"
    ), line
    assert "partition" not in pending_line(record, parse.answer("11", "PENDING", reason="Priority"))


def test_a_local_cluster_of_another_host_is_not_downed_from_here(home: Path) -> None:
    """`up --local` on one login node, `down` on another (the folder is shared): this host cannot
    see or signal that node program. Before, down marked it STOPPING, waited 120 s and blamed
    SLURM's scancel; now it says where to run it and changes nothing."""
    clusters.create("loc")
    record = ClusterRecord(
        name="loc",
        state=ClusterState.READY,
        backend="local",
        allocation_id="local-elsewhere-0a1b2c3d",
        head_host="elsewhere",
    )
    clusters.write(record)
    started = time.monotonic()
    with pytest.raises(ClusterError) as refused:
        Cluster("loc").down(timeout=30)
    assert time.monotonic() - started < 10
    assert str(refused.value) == (
        "cluster loc runs on elsewhere (raystack up --local) and this host cannot stop it: "
        "run `raystack down loc` on elsewhere; nothing was changed"
    )
    after = clusters.read("loc")
    assert after.state is ClusterState.READY and after.ending is None and after.chain_ended is None


def test_a_local_clusters_dashboard_needs_no_tunnel_on_its_own_machine() -> None:
    """A SLURM cluster's head is a compute node: the tunnel goes through the login host. A local
    cluster's head is this machine: its dashboard opens here, a tunnel only from another one."""
    from raystack.client.cluster import tunnel_line
    from raystack.store.cluster import ClusterRecord

    slurm = ClusterRecord(name="s", head_ip="10.0.0.7", dashboard_url="http://10.0.0.7:8265")
    assert tunnel_line(slurm, "127.0.0.9", 8265, "login1") == "ssh -N -L 127.0.0.9:8265:10.0.0.7:8265 login1"
    local = slurm.model_copy(
        update={"backend": "local", "head_ip": "127.0.0.1", "dashboard_url": "http://127.0.0.1:8265"}
    )
    line = tunnel_line(local, "127.0.0.9", 8265, "ws3")
    assert line.startswith("none on this machine (http://127.0.0.1:8265); from another: ssh -N -L "), line
