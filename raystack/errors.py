"""The exception hierarchy. Every message says what failed, what was involved, and what to do.

The adapters translate what SLURM and Ray answer into these types once, where the answer
arrives (adapters/slurm.py `_run`, adapters/ray.py `translate`); no caller reads an error's text
to decide what to do. Model: httpx's exception hierarchy.

    RaystackError
    ├── ConfigError            bad input; nothing was submitted
    ├── ClusterError           a cluster is missing, in the wrong state, or failed to start
    │   └── NoSuchCluster      no record of that name (store/cluster.py also has UnreadableRecord)
    ├── SlurmError             a SLURM command failed
    │   ├── SlurmUnavailable   SLURM cannot be asked: slurmctld not answering
    │   │   └── SlurmMissing   its commands are not on PATH (not a SLURM host)
    │   ├── JobNotFound        slurmctld does not know the job (it ended long ago, or never was)
    │   ├── JobEnding          the job is already completing (scancel)
    │   └── AccountingDisabled sacct: the site keeps no accounting
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


class SlurmError(RaystackError):
    """A SLURM command failed or is missing."""


class SlurmUnavailable(SlurmError):
    """SLURM cannot be asked now: slurmctld unreachable, or a command did not answer in time."""


class SlurmMissing(SlurmUnavailable):
    """SLURM's commands are not on PATH: not a SLURM login node (or `module load slurm` missing)."""


class JobNotFound(SlurmError):
    """slurmctld answered that it does not know the job ("Invalid job id")."""


class JobEnding(SlurmError):
    """scancel: the job is already completing."""


class NoSuchPartition(SlurmError):
    """sinfo lists no partition of the name asked for (a typo, or another site's profile)."""


class AccountingDisabled(SlurmError):
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
