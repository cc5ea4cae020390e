"""The queue runner (`python -m raystack.allocation.runner CLUSTER`): which jobs start and where,
their environments made ready, their ends heard and logs followed, what a job leaves released,
retries, and the lease that keeps one runner per cluster."""
