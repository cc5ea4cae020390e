"""The cluster folder on the shared filesystem, where the allocation and the client meet.

Nothing here talks to SLURM or Ray: paths (one place), records, the queue and the ledger.
"""
