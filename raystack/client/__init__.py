"""The Python API used on the login node: Cluster and Job (and the records they return)."""

from raystack.client.cluster import Cluster, filesystem_error
from raystack.client.job import Job
from raystack.client.status import ClusterStatus
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRecord, JobState

__all__ = [
    "Cluster",
    "ClusterRecord",
    "ClusterState",
    "ClusterStatus",
    "Job",
    "JobRecord",
    "JobState",
    "filesystem_error",
]
