"""SLURM's words for why a job waits: the reasons no amount of waiting clears, with what to change,
and the reasons that mean it waits for nodes that are down or drained (client/pending.py says
them through `Allocator.never_starts` and `Allocator.waits_for_nodes_out`)."""

from __future__ import annotations

# SLURM's reasons for a PENDING job that no amount of waiting clears (a limit per job, a name
# that is not valid), and what to change; reasons that clear as other jobs end are not here.
# (The names as slurm-wlm 22.05's libslurm spells them.)
_TIME, _NODES = "a shorter --time, and --chain N", "fewer --nodes"
_ASSOC = "(sacctmgr show assoc user=$USER)"
NEVER_STARTS = {  # reason: (what it means, what to change)
    "PartitionTimeLimit": ("the walltime is over the partition's limit (sinfo)", _TIME),
    "QOSMaxWallDurationPerJobLimit": ("the walltime is over your QOS's limit", _TIME),
    "AssocMaxWallDurationPerJobLimit": ("the walltime is over your account's limit", _TIME),
    "PartitionNodeLimit": ("more nodes than the partition gives one job", _NODES),
    "QOSMaxNodePerJobLimit": ("more nodes than your QOS gives one job", _NODES),
    "AssocMaxNodePerJobLimit": ("more nodes than your account gives one job", _NODES),
    "InvalidAccount": ("the account is not valid here", f"another --account {_ASSOC}"),
    "InvalidQOS": ("the QOS is not valid here", f"another --qos {_ASSOC}"),
    "BadConstraints": ("no node meets the constraint", "another --constraint (sinfo -o '%N %f')"),
}


# SLURM's words for a job that waits for nodes that are down or drained (squeue's %r: 22.05 says
# the second; others say ReqNodeNotAvail, UnavailableNodes:...).
NODES_OUT = ("ReqNodeNotAvail", "Nodes required for job are DOWN, DRAINED")
