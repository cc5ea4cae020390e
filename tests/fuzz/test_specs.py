"""Property tests over job specs, profiles and --set values: every input ends in either a valid
spec or ONE ConfigError line — never another exception, never a hang, never a huge message.
"""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raystack.errors import ConfigError
from raystack.spec.job import JobSpec
from raystack.spec.load import load_spec
from raystack.spec.profile import Profile, load_profile
from raystack.spec.values import MAX_MESSAGE

FIELDS = sorted(JobSpec.model_fields)
PROFILE_FIELDS = sorted(Profile.model_fields)
SETTINGS = settings(
    max_examples=150,
    deadline=2000,  # ms per example: a hang or an exponential blow-up fails the test
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["1e-6", "2h30m", ".inf", ".nan", "~", "&a [1]", "*a", "01:00:00", "-1", "\n", "\x00"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
keys = st.one_of(
    st.sampled_from(FIELDS + PROFILE_FIELDS + ["needs.gpus", "env.LR", "env.X Y", "outputs.ckpt"]),
    st.text(max_size=12),
)
set_items = st.builds(lambda k, v: f"{k}={v}", keys, st.one_of(st.text(max_size=30), scalars.map(str)))

yaml_snippets = st.sampled_from(
    [
        "a: &a [1, 2]\nb: [*a, *a]\n",
        "name: x\nname: y\n",
        "env: {A: [1]}\n",
        "env: {A: {b: 1}}\n",
        "timeout: .nan\n",
        "stop_grace: .inf\n",
        "- 1\n- 2\n",
        "name: [unclosed\n",
        "!!python/object:os.system {}\n",
        "outputs: {ckpt: a, CKPT: b}\n",
        "env: {RAYSTACK_JOB_ID: x}\n",
        "entrypoint: " + "x" * 140_000 + "\n",
        "",
    ]
)


def check_one_line(exc: ConfigError) -> None:
    text = str(exc)
    assert "\n" not in text, text[:200]
    assert 0 < len(text) <= MAX_MESSAGE + 200, len(text)


def spec_text(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, allow_unicode=True)


@SETTINGS
@given(data=st.dictionaries(keys, values, max_size=6), sets=st.lists(set_items, max_size=3))
def test_spec_data_and_sets(tmp_path: Path, data: dict, sets: list[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(spec_text({"name": "j", "entrypoint": "true", **data}))
    try:
        spec = load_spec(path, sets)
    except ConfigError as exc:
        check_one_line(exc)
        return
    assert isinstance(spec, JobSpec)
    assert all(isinstance(v, str) for v in spec.env.values())


@SETTINGS
@given(
    text=st.one_of(yaml_snippets, st.text(alphabet=string.printable, max_size=200)),
    sets=st.lists(set_items, max_size=2),
)
def test_spec_text(tmp_path: Path, text: str, sets: list[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: j\nentrypoint: 'true'\n" + text if text and not text.startswith("-") else text)
    try:
        load_spec(path, sets)
    except ConfigError as exc:
        check_one_line(exc)


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_spec_bytes(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(raw)
    try:
        load_spec(path)
    except ConfigError as exc:
        check_one_line(exc)


@SETTINGS
@given(data=st.dictionaries(st.sampled_from(PROFILE_FIELDS), values, max_size=5))
def test_profile_data(tmp_path: Path, data: dict) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(spec_text(data))
    try:
        profile = load_profile(str(path))
    except ConfigError as exc:
        check_one_line(exc)
        return
    assert all("\n" not in k for k in profile.env)


def bomb(depth: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, depth)]
    return "\n".join(lines) + f"\nentrypoint: *a{depth - 1}\n"


@pytest.mark.parametrize("depth", [8, 12, 40])
def test_alias_bombs_are_refused_quickly(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text("name: b\n" + bomb(depth))
    with pytest.raises(ConfigError, match="aliases") as info:
        load_spec(path)
    check_one_line(info.value)


def test_small_alias_trees_still_quote_little(tmp_path: Path) -> None:
    """Under the alias limit the error is the ordinary one, and what it quotes is cut short."""
    path = tmp_path / "small.yaml"
    path.write_text("name: b\n" + bomb(5))
    with pytest.raises(ConfigError, match="unknown key 'a0'") as info:
        load_spec(path)
    check_one_line(info.value)
