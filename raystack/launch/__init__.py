"""SPMD launchers (torchrun, the DeepSpeed launcher, accelerate) run as Ray actors, one per node."""
