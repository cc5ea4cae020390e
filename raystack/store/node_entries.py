"""The nodes' entries in the cluster folder (nodes/<host>.json): what each node program says of its
node (address, allocation, GPUs and what holds them), written by it and read by the head, the
runner and the client."""

from __future__ import annotations

import json
import os
from typing import Any

from raystack.store import paths
from raystack.store.files import atomic_write


def write_node_entry(name: str, host: str, entry: dict[str, Any]) -> None:
    atomic_write(paths.cluster(name).node_entry(host), json.dumps(entry), mode=0o600)


def allocation_ips(name: str, alloc_id: str) -> set[str]:
    """The addresses the node programs of one allocation announced (nodes/<host>.json)."""
    return {str(e.get("ip")) for e in read_node_entries(name).values() if e.get("alloc_id") == alloc_id}


def read_node_entries(name: str) -> dict[str, dict[str, Any]]:
    folder = paths.cluster(name).nodes
    entries = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entries[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):  # (gone, or being rewritten: atomic writes make it rare)
            continue
    return entries


def clear_node_entries(name: str) -> None:
    for stale in paths.cluster(name).nodes.glob("*.json"):
        os.unlink(stale)
