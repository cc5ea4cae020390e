"""Where rank 0 of a torch.distributed group listens: this node's address and a free port."""

from __future__ import annotations

import socket

import ray


def free_endpoint() -> tuple[str, int]:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return ray.util.get_node_ip_address(), sock.getsockname()[1]
