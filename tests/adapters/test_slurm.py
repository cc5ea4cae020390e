"""Parsers over SLURM output recorded on the testbed (tests/fixtures/slurm, SLURM 22.05)."""

from __future__ import annotations

import pytest

from raystack import errors
from raystack.adapters import slurm
from raystack.adapters.allocator import AllocState
from raystack.adapters.slurm import parse
from raystack.errors import NoSuchPartition, SchedulerError
from raystack.spec.values import size_to_mb

from ..conftest import FIXTURES


def fixture(name: str) -> str:
    return (FIXTURES / "slurm" / name).read_text()


def test_squeue_format_states_times_and_names() -> None:
    """Recorded with raystack's own --format on the testbed: finished, running and pending jobs."""
    jobs = parse.parse_squeue(fixture("squeue-format.txt"))
    assert {k: (v.native, v.state) for k, v in jobs.items()} == {
        "2": ("CANCELLED", AllocState.ENDED),
        "4": ("CANCELLED", AllocState.ENDED),
        "5": ("FAILED", AllocState.ENDED),
        "6": ("RUNNING", AllocState.RUNNING),
        "7": ("PENDING", AllocState.WAITING),
    }
    assert jobs["4"].name == "name with | pipe"  # the name is last: it may hold the separator
    assert jobs["6"].nodes == "node[1-2]" and jobs["6"].node_count == 2
    assert jobs["6"].end_time - jobs["6"].start_time == 600 == jobs["6"].time_limit_s
    assert jobs["7"].reason == "BeginTime" and jobs["7"].time_limit_s == 86400
    assert jobs["5"].reason == "NonZeroExitCode"
    assert all(j.state.is_terminal() for k, j in jobs.items() if k in ("2", "4", "5"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10:00", 600),
        ("1:00:00", 3600),
        ("1-00:00:00", 86400),
        ("2-03:04:05", 183845),
        ("5", 300),
        ("1-2", 93600),
        ("1-2:30", 95400),
        ("10:30", 630),
        ("UNLIMITED", 0),
        ("INVALID", 0),
        ("N/A", 0),
    ],
)
def test_slurm_durations(text: str, seconds: int) -> None:
    assert parse.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1-2", "1-2:30", "1-02:03:04", "45", "10:30", "2:00:00", "0-12"])
def test_one_reading_of_slurm_time(text: str) -> None:
    """squeue's limit and a user's --time are read the same way (`1-2` was 1 day 2 hours in one
    parser and 1 day 2 minutes in the other)."""
    from raystack.spec.values import time_to_seconds, validate_time

    assert parse.parse_duration(text) == time_to_seconds(validate_time(text))


def test_timestamps() -> None:
    assert parse.parse_timestamp("N/A") == parse.parse_timestamp("Unknown") == 0
    assert parse.parse_timestamp("2026-11-22T02:38:27") > 1_700_000_000


def test_sinfo_node_shape() -> None:
    shape = parse.parse_sinfo_nodes(fixture("sinfo-nodes.txt"), None)
    assert (shape.partition, shape.cpus, shape.gpus, shape.nodes, shape.uniform) == (
        "testbed",
        16,
        4,
        4,
        True,
    )
    mixed = "a|gpu*|64|gpu:h100:4(S:0-1)\nb|gpu*|32|gpu:h100:4,nvme:1\nc|cpu|128|(null)\n"
    shape = parse.parse_sinfo_nodes(mixed, None)
    assert (shape.partition, shape.cpus, shape.gpus, shape.uniform) == ("gpu", 32, 4, False)
    assert parse.parse_sinfo_nodes(mixed, "cpu").gpus == 0
    with pytest.raises(NoSuchPartition, match=r"no partition 'nope' here \(sinfo lists cpu, gpu\); name one"):
        parse.parse_sinfo_nodes(mixed, "nope")
    with pytest.raises(SchedulerError, match="no nodes in the default partition"):
        parse.parse_sinfo_nodes("c|cpu|128|(null)\n", None)


def test_sinfo_node_features() -> None:
    """Recorded on the testbed with the features field (%f) after `scontrol update
    NodeName=node[1-2] AvailableFeatures=h100,ib` and node3 `a100`; node4 has none, `(null)`."""
    shape = parse.parse_sinfo_nodes(fixture("sinfo-nodes-features.txt"), None)
    assert shape.features == {"h100", "ib", "a100"} and shape.mem_mb == 16000
    assert parse.parse_sinfo_nodes(fixture("sinfo-nodes-mem.txt"), None).features is None  # (not asked)
    assert parse.parse_sinfo_nodes("a|gpu*|64|gpu:4|1000|(null)\n", None).features == frozenset()


def test_sinfo_node_memory_and_sbatch_mem() -> None:
    """Recorded on the testbed with the memory field (%m, RealMemory in MB); an older recording
    without it parses with the memory unknown."""
    assert parse.parse_sinfo_nodes(fixture("sinfo-nodes-mem.txt"), None).mem_mb == 16000
    assert parse.parse_sinfo_nodes(fixture("sinfo-nodes.txt"), None).mem_mb is None
    both = "a|gpu*|64|gpu:4|515000\nb|gpu*|64|gpu:4|480000\n"
    assert parse.parse_sinfo_nodes(both, None).mem_mb == 480000
    sizes = {"500G": 512000, "200g": 204800, "16000": 16000, "1T": 1048576, "512M": 512, "0": 0}
    assert {text: size_to_mb(text) for text in sizes} == sizes  # (sbatch's --mem units: spec.values)
    with pytest.raises(ValueError):
        size_to_mb("lots")


def test_squeue_commands_name_the_cluster_folder() -> None:
    """Recorded on the testbed: `squeue --format=%i|%T|%o` of a cluster's allocation."""
    (info,) = parse.parse_squeue_commands(fixture("squeue-commands.txt"), "raystack-rec").values()
    assert info.state.is_active() and info.name == "raystack-rec"
    assert info.command.endswith("/clusters/rec/raystack.sbatch")
    odd = parse.parse_squeue_commands("7|PENDING|/x/a|b/raystack.sbatch\njunk\n", "n")
    assert odd["7"].command == "/x/a|b/raystack.sbatch" and len(odd) == 1


def test_sinfo_time_limits() -> None:
    """`sinfo --format=%P|%l` as SLURM prints it: the default partition marked '*'."""
    text = "gh*|1-00:00:00\ndebug|30:00\nlong|infinite\nodd|2h\n"
    assert parse.parse_sinfo_time_limits(text, None) == ("gh", 86400)
    assert parse.parse_sinfo_time_limits(text, "debug") == ("debug", 1800)
    assert parse.parse_sinfo_time_limits(text, "long") == ("long", None)
    assert parse.parse_sinfo_time_limits(text, "odd") is None  # (not SLURM's: no limit guessed)
    assert parse.parse_sinfo_time_limits(text, "nope") is None
    assert parse.parse_sinfo_time_limits("testbed*|infinite\n", None) == ("testbed", None)


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:4", 4),
        ("gpu:a100:8(S:0-1)", 8),
        ("gpu:h100:4,nvme:1", 4),
        ("(null)", 0),
        ("gpu:a100:2,gpu:v100:2", 4),
        ("", 0),
    ],
)
def test_gres_gpus(gres: str, gpus: int) -> None:
    assert parse.gres_gpus(gres) == gpus


@pytest.mark.parametrize(
    ("raw", "native", "state"),
    [
        ("RUNNING", "RUNNING", AllocState.RUNNING),
        ("PENDING", "PENDING", AllocState.WAITING),
        ("CONFIGURING", "CONFIGURING", AllocState.STARTING),
        ("COMPLETING", "COMPLETING", AllocState.ENDING),
        ("CANCELLED by 0", "CANCELLED", AllocState.ENDED),
        ("OOM", "OUT_OF_MEMORY", AllocState.ENDED),
        ("NODE_FAIL", "NODE_FAIL", AllocState.ENDED),
        ("SOMETHING_NEW", "SOMETHING_NEW", AllocState.UNKNOWN),
        ("", "", AllocState.UNKNOWN),
    ],
)
def test_state_table(raw: str, native: str, state: AllocState) -> None:
    """SLURM's word is kept (messages, why_ended); raystack judges by the state in its own words."""
    got = parse.answer("1", raw)
    assert (got.native, got.state) == (native, state)


def test_terminal_and_active() -> None:
    assert AllocState.ENDED.is_terminal() and not AllocState.ENDED.is_active()
    assert AllocState.GONE.is_terminal()
    assert AllocState.WAITING.is_active() and not AllocState.WAITING.is_terminal()
    assert not AllocState.UNKNOWN.is_terminal() and not AllocState.UNKNOWN.is_active()


@pytest.mark.parametrize(("out", "job"), [("123\n", "123"), ("77;cluster2\n", "77"), ("warn\n9\n", "9")])
def test_sbatch_parsable(out: str, job: str) -> None:
    assert parse.parse_sbatch_parsable(out) == job


def test_sbatch_parsable_garbage() -> None:
    with pytest.raises(SchedulerError, match="could not read a job id"):
        parse.parse_sbatch_parsable("Submitted batch job 5")


def test_sacct_parsable2_skips_steps() -> None:
    # The format raystack asks for (parse.SACCT_FIELDS); the testbed has no accounting
    # database (see fixtures/slurm/sacct-disabled.txt), so this line is written by hand.
    text = "42|TIMEOUT|raystack-a|node[1-2]|2026-01-01T00:00:00|2026-01-02T00:00:00|0:0\n"
    text += "42.batch|CANCELLED|batch|node1|x|y|0:15\n"
    jobs = parse.parse_sacct(text)
    assert list(jobs) == ["42"]
    assert jobs["42"].state is AllocState.ENDED and jobs["42"].native == "TIMEOUT"


def test_sacct_disabled_message_is_recorded() -> None:
    assert "accounting storage is disabled" in fixture("sacct-disabled.txt")


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        # seen on the testbed (slurm-wlm 22.05)
        ("slurm_load_jobs error: Invalid job id specified", errors.AllocationNotFound),
        ("Slurm accounting storage is disabled", errors.AccountingDisabled),
        # as SLURM's commands word them (not reproducible on the testbed)
        (
            "scancel: error: Kill job error on job id 12: Job/step already completing or completed",
            errors.AllocationEnding,
        ),
        ("squeue: error: Unable to contact slurm controller (connect failure)", errors.SchedulerUnavailable),
        (  # (recorded: slurm-client on a host whose slurm.conf is missing; no DNS SRV record)
            "sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host sinfo: error: "
            "fetch_config: DNS SRV lookup failed sinfo: fatal: Could not establish a configuration source",
            errors.SchedulerUnavailable,
        ),
        (
            "sbatch: error: Batch job submission failed: Requested node configuration is not available",
            errors.SchedulerError,
        ),
    ],
)
def test_refusals_are_typed_where_they_arrive(stderr: str, kind: type) -> None:
    assert slurm.refusal(stderr) is kind


def test_a_missing_command_is_slurm_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(errors.SchedulerMissing, match="is not on PATH"):
        slurm.node_shape(None)

    assert slurm.job_info("4242") is None  # cannot be asked: never an answer


def test_slurm_that_did_not_answer_is_not_asked_again_for_a_while(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """squeue that gave up after its own timeout (a hung slurmctld): the next asks within QUIET
    get "unknown" at once, not another 20 s each; a quick failure is asked again."""
    from raystack.adapters.slurm import SlurmAllocator

    now, asked = [0.0], []

    def job_info(alloc_id: str, took: float = 20.0) -> None:
        asked.append(alloc_id)
        now[0] += took
        return None

    monkeypatch.setattr(slurm, "job_info", job_info)
    backend = SlurmAllocator(clock=lambda: now[0])
    assert backend.info("7") is None and asked == ["7"]
    said = [r.getMessage() for r in caplog.records]  # (once: the user hears why it took 20 s)
    assert said == [
        "raystack: warning: SLURM did not answer in 20s (slurmctld busy or down?); "
        "clusters are shown as last recorded"
    ]
    now[0] += 2  # (past the cache)
    backend.forget()
    assert backend.info("7") is None and backend.info("8") is None and asked == ["7"]
    now[0] += backend.QUIET
    assert backend.info("7") is None and asked == ["7", "7"]
    now[0] += backend.QUIET + 1
    monkeypatch.setattr(slurm, "job_info", lambda alloc_id: job_info(alloc_id, took=0.1))
    assert backend.info("9") is None
    now[0] += 2
    assert backend.info("9") is None and asked == ["7", "7", "9", "9"]  # a blip: asked again
    assert len(caplog.records) == 2  # (the second slow ask; a blip says nothing)


def test_restart_count_as_squeue_prints_it() -> None:
    """`squeue --noheader --jobs=ID --Format=RestartCnt`, recorded on the testbed: a padded
    column; nothing when squeue no longer lists the job."""
    assert parse.parse_restart_count("0                   \n") == 0
    assert parse.parse_restart_count("1                   \n") == 1
    assert parse.parse_restart_count("") is None


def test_sinfo_nodes_that_cannot_run_jobs() -> None:
    # (recorded on the testbed: scontrol update nodename=node3 state=down reason="bad dimm", node4 drained)
    text = (FIXTURES / "slurm" / "sinfo-nodes-states.txt").read_text()
    out = {"node3": "down (bad dimm)", "node4": "drained (maintenance)"}
    assert parse.parse_sinfo_out(text, "testbed") == (2, out)
    assert parse.parse_sinfo_out(text, None) == (2, out)  # (the default partition)
    assert parse.parse_sinfo_out(text, "gpu") == (0, {})
    # a node not responding (its slurmd gone: '*' after the state) runs nothing either
    assert parse.parse_sinfo_out("node3|testbed*|idle*|none\nnode1|testbed*|mixed|none\n", None) == (
        1,
        {"node3": "idle*"},
    )
