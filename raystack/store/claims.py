"""Who holds a cluster's name while an allocation is being submitted: `raystack up` claims the
record under the folder's lock with its host and pid before it calls the scheduler (begin), a
second `up` of the name finds the claim, and a claim whose process is gone is abandoned (the name
is free again)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

from raystack.errors import ClusterError
from raystack.store import paths
from raystack.store.cluster import (
    ClusterRecord,
    ClusterState,
    apply_changes,
    create,
    exists,
    read,
    submitter,
    write,
)
from raystack.store.files import locked, make_private_dirs
from raystack.store.node_entries import clear_node_entries

SUBMIT_STALE = 600.0  # seconds: a submit from another host that recorded no allocation is over


def submitting(record: ClusterRecord, now: float | None = None) -> bool:
    """A `raystack up` is submitting this record's allocation now: SUBMITTED with no allocation id
    yet, written by a process that still runs (on this host; from another, SUBMIT_STALE seconds
    are given). One that was interrupted (Ctrl-C in a hung sbatch) holds the name no longer
    (`raystack down NAME` clears a claim whose pid another process took since)."""
    if record.state is not ClusterState.SUBMITTED or record.allocation_id:
        return False
    host, _, pid = (record.submitter or "").rpartition(":")
    if host == socket.gethostname() and pid.isdigit():  # (however long sbatch takes)
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # (alive, another user's)
            return True
        return True
    return (now or time.time()) - record.updated < SUBMIT_STALE


def abandoned(record: ClusterRecord) -> bool:
    """SUBMITTED with no allocation id by a `raystack up` that submits it no longer (stopped in
    sbatch): nothing was recorded as started, and nothing will be."""
    return record.state is ClusterState.SUBMITTED and not record.allocation_id and not submitting(record)


def in_use(record: ClusterRecord) -> str | None:
    """Why a new cluster cannot take this record's name (it is live, or being submitted), else
    None. `record` as SLURM last said (settled): an allocation that ended unrecorded is ended."""
    name = record.name
    if record.state.is_terminal() or abandoned(record):
        return None
    if submitting(record):
        return (
            f"name '{name}' is being submitted by another `raystack up` ({record.submitter}, "
            f"{time.time() - record.updated:.0f}s ago): wait for it (`raystack status {name}`), or "
            "choose another --name"
        )
    alloc = f"allocation {record.allocation_id}, " if record.allocation_id else ""
    return (
        f"name '{name}' is in use by a live cluster ({alloc}{record.state.value}): "
        f"`raystack down {name}` first, or choose another --name"
    )


def update_if(name: str, holds: Callable[[ClusterRecord], bool], **changes: Any) -> ClusterRecord | None:
    """`update` while `holds(record)` is true under the lock; None, and nothing written, when it
    is not (or the record is gone): a change decided on a record read earlier, without the lock."""
    if not exists(name):
        return None
    with locked(paths.cluster(name)):
        record = read(name)
        if not holds(record):
            return None
        apply_changes(record, changes)
        write(record)
        return record


def update_claim(name: str, **changes: Any) -> ClusterRecord | None:
    """`update`, by the `raystack up` that began this record, of its claim (SUBMITTED, no
    allocation id yet); None once it is no longer that (stopped by `raystack down`, or begun
    again by another `up`, while sbatch ran; forgotten)."""

    def mine(record: ClusterRecord) -> bool:
        claim = record.state is ClusterState.SUBMITTED and not record.allocation_id
        return claim and record.submitter == submitter()

    return update_if(name, mine, **changes)


def begin(name: str, **fields: Any) -> ClusterRecord:
    """A fresh cluster folder (private, a new token, no node entry of an earlier allocation) and
    its first record, made of `fields`. Under the folder lock, and refused (ClusterError) when the
    name is in use meanwhile: two `raystack up --name X` at once submit one allocation, not two."""
    p = paths.cluster(name)
    make_private_dirs(p)
    with locked(p):
        if exists(name) and (why := in_use(read(name))):
            raise ClusterError(why)
        create(name)
        clear_node_entries(name)
        record = ClusterRecord(name=name, submitter=submitter(), **fields)
        write(record)
    return record
