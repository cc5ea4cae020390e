"""GPT-NeoX's train.py under raystack's DeepSpeed launcher (`kind: spmd, launcher: deepspeed`).

deepy.py reads the YAML configs once, works out the world from a hostfile, and starts the ranks
through pdsh or srun with the configs serialised into --deepspeed_config/--megatron_config. On a
raystack cluster each node's launcher is started for it (`deepspeed --no_ssh --node_rank r`), so
every rank does that reading itself, from the same files (the job's working_dir is the same on
every node), with the world its launcher set (WORLD_SIZE) instead of a hostfile's:

    command: neox_train.py configs/125M.yml configs/local_setup.yml

Put this file in the root of a gpt-neox checkout (next to train.py and deepy.py).
"""

from __future__ import annotations

import os
import sys


def neox_args(confs: list[str], world: int) -> list[str]:
    """The arguments deepy.py would give train.py: everything after the user script."""
    from megatron.neox_arguments import NeoXArgs

    confs = [c if c.endswith((".yml", ".yaml", ".json")) else c + ".yml" for c in confs]
    args = NeoXArgs.from_ymls(confs, overwrite_values={"user_script": "train.py", "global_num_gpus": world})
    main_args = args.get_deepspeed_main_args()
    return main_args[main_args.index("train.py") + 1 :]


def main() -> None:
    confs = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds it
    if not confs:
        sys.exit("usage: neox_train.py CONFIG.yml [CONFIG.yml ...]")
    sys.path.insert(0, os.getcwd())  # NeoX's train.py and megatron/ live in the working_dir
    import train  # NeoX's own train.py

    train.main(input_args=neox_args(confs, int(os.environ.get("WORLD_SIZE", "1"))))


if __name__ == "__main__":
    main()
