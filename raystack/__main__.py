"""`python -m raystack ...`: the same command as `raystack ...`."""

from raystack.cli import main

main()
