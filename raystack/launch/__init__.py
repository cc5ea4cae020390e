"""SPMD launchers (torchrun, the DeepSpeed launcher, accelerate), one per node, on the node's
launch host (pool.py) or in a launcher actor of the job (spmd.py); and the hook that keeps a
packed job on its own nodes (pinned/sitecustomize.py)."""

from pathlib import Path

# On PYTHONPATH of every process of a packed job (the queue runner puts it there).
PIN_DIR = Path(__file__).resolve().parent / "pinned"
# The folder a job without a working_dir was submitted from: its driver and every node's
# launcher start there (spec/submission.py sets it, launch/spmd.py reads it).
SUBMIT_DIR_ENV = "RAYSTACK_SUBMIT_DIR"
# A job's secrets (store/secrets.py): the file its driver sources, and their names, with which an
# SPMD driver hands their values to every node's launcher (Ray's actors do not inherit the
# driver's environment).
SECRETS_ENV = "RAYSTACK_SECRETS"
SECRET_NAMES_ENV = "RAYSTACK_SECRET_NAMES"
# The node's private temp folder (allocation/node/raystart.py gives it to every Ray process of a node;
# removed at the cluster's end, or by the next start on the node: allocation/node/tempsweep.py): what
# the launchers write on a node (unpacked working_dirs, the ranks' log files) goes there.
NODE_TMP_ENV = "RAYSTACK_NODE_TMP"
