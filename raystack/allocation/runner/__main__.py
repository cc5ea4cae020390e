"""`python -m raystack.allocation.runner`: loop.py's main."""

from raystack.allocation.runner.loop import main

main()
