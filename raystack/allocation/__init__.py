"""What runs inside the allocation: the sbatch plan and script, the node program, Ray's processes
and the queue runner."""
