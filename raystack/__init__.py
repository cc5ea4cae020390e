"""raystack: a persistent, authenticated Ray cluster and a job queue on a SLURM allocation."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("raystack-slurm")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

if TYPE_CHECKING:
    from raystack.client.cluster import Cluster
    from raystack.client.job import Job
    from raystack.client.status import ClusterStatus
    from raystack.errors import RaystackError

__all__ = ["Cluster", "ClusterStatus", "Job", "RaystackError", "__version__"]


def __getattr__(name: str) -> Any:
    """Lazy exports: the node program and the runner import only what they use."""
    if name in ("Cluster", "ClusterStatus", "Job"):
        from raystack import client

        return getattr(client, name)
    if name == "RaystackError":
        from raystack.errors import RaystackError

        return RaystackError
    raise AttributeError(f"module 'raystack' has no attribute {name!r}")
