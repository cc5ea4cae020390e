"""The only code that talks to external systems: SLURM (slurm/) and Ray's HTTP APIs (ray.py).

Importing the package registers both allocators (allocator.py's interface; slurm/ and
local.py implement it), so `allocator.allocator(backend)` always finds them.
"""

from raystack.adapters import local, slurm  # noqa: F401  (each registers its Allocator)
