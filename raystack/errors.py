"""The exception hierarchy. Every message says what failed, what was involved, and what to do."""


class RaystackError(Exception):
    """Base of every error raystack raises on purpose; the CLI prints it as one line."""


class ConfigError(RaystackError):
    """A profile, job spec or command-line value is invalid; nothing was submitted."""


class SlurmError(RaystackError):
    """A SLURM command failed or is missing."""


class ClusterError(RaystackError):
    """A cluster is missing, in the wrong state, or failed to start."""


class RayApiError(RaystackError):
    """The Ray dashboard (Jobs or State API) refused or did not answer."""
