"""raystack: a persistent, authenticated Ray cluster and a job queue on a SLURM allocation."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("raystack")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

from raystack.cluster import Cluster, ClusterStatus
from raystack.errors import RaystackError

__all__ = ["Cluster", "ClusterStatus", "RaystackError", "__version__"]
