"""Node-private files: Ray's temp dir lives in a fresh 0700 folder of this user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from raystack.allocation.node.context import NodeContext, private_temp_dir
from raystack.client.cluster import loopback_for
from raystack.errors import RaystackError


def ctx(tmp_path: Path) -> NodeContext:
    return NodeContext("c", "7", 0, 1, "node1", "10.0.0.1", 0, 1, tmp_path / "rs-7-node1", 1 << 27, 30.0)


def test_the_temp_dir_is_private_fresh_and_short(tmp_path: Path) -> None:
    first = private_temp_dir(ctx(tmp_path))
    second = private_temp_dir(ctx(tmp_path))
    assert first.temp_root and second.temp_root and first.temp_root != second.temp_root  # unpredictable
    for c in (first, second):
        st = c.temp_root.stat()  # type: ignore[union-attr]
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        assert c.temp_dir.parent == c.temp_root and c.temp_root.name.startswith("rs-7-node1-")


def test_a_scratch_that_is_not_a_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    bad = ctx(tmp_path)
    bad.temp_dir = tmp_path / "file" / "rs-7-node1"
    with pytest.raises((RaystackError, OSError)):
        private_temp_dir(bad)


def test_each_cluster_gets_its_own_loopback_address() -> None:
    assert loopback_for("grpo") == loopback_for("grpo")
    addresses = {loopback_for(f"c{i}") for i in range(50)}
    assert len(addresses) > 40 and all(a.startswith("127.0.0.") for a in addresses)
    assert all(2 <= int(a.rsplit(".", 1)[1]) <= 251 for a in addresses)
