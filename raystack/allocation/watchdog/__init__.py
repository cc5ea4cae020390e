"""The watchdog over the jobs in flight: its verdicts (infeasible, stuck, hung), and what the nodes
give it (their progress probe and their stack dumps)."""
