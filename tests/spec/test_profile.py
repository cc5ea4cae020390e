"""Profiles: typed, validated when loaded; errors are one line naming file, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec import profile as config
from raystack.spec.profile import Profile, load_profile
from raystack.spec.values import size_to_mb, time_to_seconds, validate_time


@pytest.mark.parametrize("name", ["generic", "testbed", "isambard", "brtx", "supercloud"])
def test_builtin_profiles_load(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert "CUDA_VISIBLE_DEVICES" not in profile.env


def test_site_facts_from_the_seeds() -> None:
    isambard, brtx, supercloud = (load_profile(n) for n in ("isambard", "brtx", "supercloud"))
    assert isambard.gpus_per_node == 4 and time_to_seconds(isambard.time) == 24 * 3600
    assert isambard.env["NCCL_CUMEM_ENABLE"] == "0" and isambard.env["FI_PROVIDER"] == "cxi"
    assert brtx.gpus_per_node == 8 and brtx.partition == "brtx6" and brtx.local_scratch == "/srv/local1"
    assert supercloud.gpus_per_node == 2 and supercloud.gpu_type == "volta"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30", 1800), ("10:30", 630), ("24:00:00", 86400), ("1-00", 86400), ("2-03:04:05", 183845)],
)
def test_slurm_time_forms(value: str, seconds: int) -> None:
    assert time_to_seconds(validate_time(value)) == seconds


@pytest.mark.parametrize("bad", ["", "24:00:00:00", "-5", "abc", "UNLIMITED"])
def test_bad_time_names_the_field_and_the_fix(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--time: .* use minutes, or SLURM's M:S, H:M:S, .* 2h, 1d"):
        validate_time(bad)


@pytest.mark.parametrize("zero", ["0", 0, "off", "0s"])
def test_a_walltime_of_nothing_is_refused(zero: object) -> None:
    with pytest.raises(ConfigError, match=r"--time: .*(no time at all|cannot be off)"):
        validate_time(zero)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "sbatch_text"),
    [("2h", "2:00:00"), ("90m", "1:30:00"), ("1d12h", "1-12:00:00"), ("24:00:00", "24:00:00"), ("30", "30")],
)
def test_a_walltime_with_units_reaches_sbatch_in_slurms_form(value: str, sbatch_text: str) -> None:
    assert validate_time(value) == sbatch_text


def test_sizes() -> None:
    assert size_to_mb("256MB") == 256 and size_to_mb("2GB") == 2048 and size_to_mb("1.5GiB") == 1536
    with pytest.raises(ValueError):
        size_to_mb("lots")


def write_profile(folder: Path, name: str, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder.parents[1]))


def test_user_profile_dir_is_searched_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile(tmp_path / "cfg/raystack/profiles", "generic", "time: '00:05:00'\n", monkeypatch)
    assert load_profile("generic").time == "00:05:00"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("partitoin: gpu\n", r"unknown key 'partitoin' \(did you mean 'partition'\?\); valid keys: "),
        ("ray_logs: {evry: 5}\n", r"ray_logs.evry' \(did you mean 'every'.*keys: every, file_mb, node_mb$"),
        ("walltime: 24:00:00\n", r"unknown key 'walltime' \(raystack calls it time \(sbatch --time\)\)"),
        ("modules: [cuda]\n", r"'modules' \(shell lines run on every node before Ray go under setup:"),
        ("nodes: 4\n", r"'nodes' \(the node count is `raystack up --nodes N`, not a profile key\)"),
        ("gpus_per_node: -1\n", r"field 'gpus_per_node'"),
        ("gpus_per_node: four\n", r"field 'gpus_per_node'"),
        ("time: forever\n", r"field 'time': 'forever' is not a duration; use minutes"),
        ("env: {CUDA_VISIBLE_DEVICES: '0'}\n", r"never set CUDA_VISIBLE_DEVICES"),
        ("env: {'BAD-NAME': x}\n", r"not an environment variable name"),
        ("extra_sbatch: ['-p gpu']\n", r"'-p gpu': the profile has a key for it: partition: NAME"),
        ("extra_sbatch: ['--nodes=3']\n", r"raystack sets --nodes itself|--nodes is raystack up's own"),
        ("join_timeout: 2s\n", r"field 'join_timeout': '2s' is less than 5s"),
        ("object_store_memory: lots\n", r"field 'object_store_memory'"),
        ("- a\n- b\n", r"must be a mapping"),
        ("time: [unclosed\n", r"not valid YAML"),
        ("idle_timeout: soon\n", r"field 'idle_timeout': 'soon' is not a duration"),
        ("chain: yes\n", r"field 'chain': true is a yes/no \(YAML reads yes, no, on, off so\), not a number"),
        ("prometheus: /usr/bin/prometheus\n", r"prometheus needs `metrics: true`"),
        ("grafana_host: http://g:3000\n", r"grafana_host needs `metrics: true`"),
        ("backend: pbs\n", r"field 'backend'.*no scheduler 'pbs' here; one of local, slurm"),
    ],
)
def test_bad_profile_is_one_line_naming_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    write_profile(tmp_path / "cfg/raystack/profiles", "mysite", text, monkeypatch)
    with pytest.raises(ConfigError, match=message) as info:
        load_profile("mysite")
    assert "\n" not in str(info.value)
    assert "mysite.yaml" in str(info.value)


def test_a_bare_off_in_a_profile_turns_the_timeouts_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_profile(
        tmp_path / "cfg/raystack/profiles", "quiet", "idle_timeout: off\nhang_timeout: no\n", monkeypatch
    )
    prof = load_profile("quiet")
    assert (prof.idle_timeout, prof.hang_timeout) == (None, None)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown profile 'nope': choose one of .*isambard.*testbed"):
        load_profile("nope")


def test_profile_is_frozen() -> None:
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type varies
        Profile().time = "1"  # type: ignore[misc]


def test_builtin_dir_is_in_the_repo() -> None:
    assert (config.BUILTIN_PROFILES / "generic.yaml").is_file()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30m", 1800.0),
        ("1h", 3600.0),
        (90, 5400.0),
        ("90s", 90.0),
        ("off", None),
        ("0", None),
        (0, None),
        (None, None),
    ],
)
def test_idle_timeout_forms(value: object, seconds: float | None) -> None:
    assert Profile(idle_timeout=value).idle_timeout == seconds  # type: ignore[arg-type]


def test_isambard_has_both_nccl_paths() -> None:
    plugin, system = load_profile("isambard"), load_profile("isambard-nccl")
    assert any("brics/aws-ofi-nccl" in line for line in plugin.setup)
    assert not any("LD_PRELOAD" in line for line in plugin.setup)
    assert any("brics/nccl/2.26.6-1" in line for line in system.setup)
    assert any(line.startswith("export LD_PRELOAD=") for line in system.setup)
    for prof in (plugin, system):
        assert prof.exclusive and prof.env["FI_PROVIDER"] == "cxi" and prof.env["NCCL_CUMEM_ENABLE"] == "0"


def test_unquoted_yaml_times_are_times_not_base_60_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """YAML 1.1 reads 24:00:00 as 86400; raystack reads it as SLURM does."""
    path = tmp_path / "site.yaml"
    path.write_text("time: 24:00:00\nsignal_lead: 5:00\nidle_timeout: 1:30:00\ngpus_per_node: 4\n")
    prof = load_profile(str(path))
    assert time_to_seconds(prof.time) == 86400 and prof.signal_lead == 300 and prof.idle_timeout == 5400


def test_setup_as_one_line_or_a_block_is_a_list_of_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "cfg/raystack/profiles"
    write_profile(folder, "one", "setup: module load cuda/12.6\n", monkeypatch)
    assert load_profile("one").setup == ["module load cuda/12.6"]
    write_profile(
        folder, "block", "setup: |\n  module load cuda\n\n  source ~/venv/bin/activate\n", monkeypatch
    )
    assert load_profile("block").setup == ["module load cuda", "source ~/venv/bin/activate"]
    write_profile(folder, "bad", "setup: {module: cuda}\n", monkeypatch)
    with pytest.raises(ConfigError, match=r"field 'setup'"):
        load_profile("bad")


def test_a_profile_may_name_the_local_backend_and_up_local_is_that_backend() -> None:
    """`backend: local` is a backend as any other (`up --local` plans on it): this machine's
    GPUs and CPUs, one node, no walltime asked."""
    from raystack.client import allocate

    prof = Profile(backend="local", gpus_per_node=0, cpus_per_task=1)
    plan = allocate.plan(1, profile=prof, name="here")
    assert plan.backend == "local" and plan.argv() == [] and plan.cpus_per_task == 1
    assert allocate.local_profile("generic").backend == "local"
    assert 'exec "$RAYSTACK_PYTHON" -m raystack.allocation.node' in allocate.render_script(plan)
