"""The elastic cluster: nodes asked for by the queue, grown allocations leaving, and the idle
autostop."""
