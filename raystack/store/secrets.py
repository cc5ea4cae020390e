"""A job's secrets (the spec's `secrets: [WANDB_API_KEY, HF_TOKEN]`, `submit --secret NAME`).

Their values are taken from the submitter's environment at submit and kept in one file per job
request, `secrets/<nonce>.env` in the cluster folder (the folder 0700, the file 0600), written
before the job is queued. The job's driver reads it when it starts (spec/submission.py: its
entrypoint sources the file; an SPMD job's ranks get them from their driver), and it is removed
when the job ends. The ledger keeps the names only; the logs, `--json` output and Ray's
runtime_env hold the file's path, never a value.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from raystack.errors import ConfigError
from raystack.store import paths
from raystack.store.files import atomic_write

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_VALUE = 64 << 10  # bytes of one value
LOOKS_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)


def file(cluster: str, nonce: str) -> Path:
    return paths.cluster(cluster).secrets / f"{nonce}.env"


def take(names: list[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The values of `names` from the submitter's environment; a one-line error for a name that
    is no variable name, is not set, or is too long to carry."""
    values = {}
    for name in names:
        if not NAME.fullmatch(name):
            raise ConfigError(f"secrets: {name!r} is not an environment variable name (letters, digits, '_')")
        if name not in environ:
            raise ConfigError(
                f"secrets: {name} is not set in your environment; export it before submitting "
                "(its value is read now and never written into the ledger)"
            )
        if len(environ[name].encode()) > MAX_VALUE:
            raise ConfigError(f"secrets: {name} is over {MAX_VALUE >> 10} KiB; pass a file's path instead")
        values[name] = environ[name]
    return values


def keep(cluster: str, nonce: str, values: Mapping[str, str]) -> Path:
    """Write the job request's secrets (0600) where its driver reads them; the file's path."""
    target = file(cluster, nonce)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(target, "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items()), mode=0o600)
    return target


def forget(cluster: str, nonce: str) -> None:
    """Remove a job request's secrets (the job ended, or it was never queued)."""
    with contextlib.suppress(OSError):
        file(cluster, nonce).unlink()


def looks_secret(env: Mapping[str, str]) -> list[str]:
    """Names of `env` whose values look like secrets (…_KEY, …_TOKEN, …SECRET, …PASSWORD)."""
    return [k for k, v in env.items() if v and LOOKS_SECRET.search(k)]
