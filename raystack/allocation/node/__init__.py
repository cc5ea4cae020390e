"""What every node of an allocation runs (`python -m raystack.allocation.node`): its context,
Ray's start and processes, a worker's watch on the head, the periodic duties (usage samples, GPUs,
log copies) and the sweeps of what an allocation left behind."""
