"""The exception hierarchy. Every message says what failed, what was involved, and what to do.

The adapters translate what SLURM and Ray answer into these types once, where the answer
arrives (adapters/slurm/ `_run`, adapters/ray.py `translate`); no caller reads an error's text
to decide what to do. Model: httpx's exception hierarchy.

    RaystackError
    ├── ConfigError            bad input; nothing was submitted
    ├── ClusterError           a cluster is missing, in the wrong state, or failed to start
    │   └── NoSuchCluster      no record of that name (store/cluster.py also has UnreadableRecord)
    ├── SchedulerError         the scheduler (SLURM, ...) refused or failed a request
    │   ├── SchedulerUnavailable   it cannot be asked: its controller is not answering
    │   │   └── SchedulerMissing   its commands are not on PATH (not a login node of it)
    │   ├── AllocationNotFound     it does not know the allocation (ended long ago, or never was)
    │   ├── AllocationEnding       the allocation is already completing (a cancel came late)
    │   ├── NoSuchPartition        no partition (queue) of that name
    │   └── AccountingDisabled     it keeps no accounting of ended allocations
    └── RayApiError            the dashboard (Jobs or State API) refused or did not answer
        ├── RayUnreachable     no answer at all (connection refused, timed out): try again
        ├── AuthRejected       401: the token was refused
        ├── NotFound           Ray does not know that submission id
        └── AlreadyExists      a job with that submission id exists already
"""


class RaystackError(Exception):
    """Base of every error raystack raises on purpose; the CLI prints it as one line."""


class ConfigError(RaystackError):
    """A profile, job spec or command-line value is invalid; nothing was submitted."""


class SchedulerError(RaystackError):
    """The scheduler refused or failed a request, or cannot be asked (each adapter translates its own)."""


class SchedulerUnavailable(SchedulerError):
    """The scheduler cannot be asked now: its controller unreachable, or a command did not answer in time."""


class SchedulerMissing(SchedulerUnavailable):
    """The scheduler's commands are not on PATH: not a login node of it (or a `module load` missing)."""


class AllocationNotFound(SchedulerError):
    """The scheduler answered that it does not know the allocation (SLURM: "Invalid job id")."""


class AllocationEnding(SchedulerError):
    """A cancel came when the allocation was already completing."""


class NoSuchPartition(SchedulerError):
    """sinfo lists no partition of the name asked for (a typo, or another site's profile)."""


class AccountingDisabled(SchedulerError):
    """sacct: the site runs without accounting storage."""


class ClusterError(RaystackError):
    """A cluster is missing, in the wrong state, or failed to start."""


class NoSuchCluster(ClusterError):
    """No cluster of that name has a record in $RAYSTACK_HOME."""


class RayApiError(RaystackError):
    """The Ray dashboard (Jobs or State API) refused or did not answer."""


class RayUnreachable(RayApiError):
    """The dashboard did not answer at all (connection refused or timed out): transient."""


class AuthRejected(RayApiError):
    """The dashboard refused the token (401)."""


class NotFound(RayApiError):
    """Ray does not know the submission id asked about."""


class AlreadyExists(RayApiError):
    """A job with this submission id exists already."""


# The names of 0.1, deprecated (removed in the next release): SLURM's words for the scheduler's errors.
SlurmError = SchedulerError
SlurmUnavailable = SchedulerUnavailable
SlurmMissing = SchedulerMissing
JobNotFound = AllocationNotFound
JobEnding = AllocationEnding
