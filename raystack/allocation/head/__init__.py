"""The head node's own duties: its program (the Ray head, the queue runner's keeper, the
allocation's end), readiness, the first job's warm-up, the interconnect canary, Prometheus and the
dashboard's TLS front."""
