"""The Python API used on the login node: Cluster and Job."""

from raystack.client.cluster import Cluster, ClusterStatus
from raystack.client.job import Job

__all__ = ["Cluster", "ClusterStatus", "Job"]
