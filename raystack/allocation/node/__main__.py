"""`python -m raystack.allocation.node`: program.py's main."""

from raystack.allocation.node.program import main

main()
