"""What the metric outputs (Prometheus, OTLP metrics) share about their series: which processes,
stacks and threads get series of their own (selection.py), and which frame of a stack names where
the application waited (wait_site.py)."""
