"""The only code that talks to external systems: SLURM (slurm.py) and Ray's HTTP APIs (ray.py)."""
