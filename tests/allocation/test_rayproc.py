"""Port choice on a node shared by several clusters (rayproc.free_ports)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import pytest

from raystack.allocation.node import rayproc


class Kernel:
    """bind(0) as a busy node's kernel may answer two heads starting at once: the ports one head
    chose and released come back to the next (what the claims must keep apart)."""

    def __init__(self, answers: list[int]):
        self.answers = answers
        self.bound: set[int] = set()

    def socket(self, *args: object) -> Kernel.Sock:
        return Kernel.Sock(self)

    class Sock:
        def __init__(self, kernel: Kernel):
            self.kernel, self.port = kernel, 0

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(p for p in self.kernel.answers if p not in self.kernel.bound)
            self.kernel.bound.add(self.port)

        def getsockname(self) -> tuple[str, int]:
            return ("0.0.0.0", self.port)

        def close(self) -> None:
            self.kernel.bound.discard(self.port)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Kernel:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kernel = Kernel([40001, 40003, 40005, 40007, 40009])
    monkeypatch.setattr(rayproc.socket, "socket", kernel.socket)
    return kernel


def test_two_heads_starting_at_once_never_get_the_same_port(node: Kernel, tmp_path: Path) -> None:
    first = rayproc.free_ports(2)
    second = rayproc.free_ports(2)  # (the kernel offers 40001 and 40003 again: both released)
    assert first == [40001, 40003] and second == [40005, 40007]
    claims = json.loads((tmp_path / f"raystack-ports-{os.getuid()}.json").read_text())
    assert sorted(map(int, claims)) == [40001, 40003, 40005, 40007]


def test_a_claim_ends_once_ray_had_time_to_bind_the_port(
    node: Kernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert rayproc.free_ports(2) == [40001, 40003]
    monkeypatch.setattr(rayproc.time, "time", lambda: 4e9)  # (long after CLAIM_FOR)
    assert rayproc.free_ports(2) == [40001, 40003]


def test_real_ports_are_bindable_and_distinct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ports = rayproc.free_ports(5) + rayproc.free_ports(5)
    assert len(set(ports)) == 10
    with socket.socket() as sock:
        sock.bind(("", ports[0]))


def test_a_link_planted_in_the_shared_tmp_is_never_written_through(node: Kernel, tmp_path: Path) -> None:
    """Another user may plant the claims file's name in /tmp as a link to a file of ours: it is
    not followed (the ports are then chosen by the kernel alone)."""
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / f"raystack-ports-{os.getuid()}.json").symlink_to(victim)
    assert rayproc.free_ports(2) == [40001, 40003]
    assert victim.read_text() == "keep me\n"
