"""OTLP push: off-CPU profiles (profiles v1development) and the off-CPU counters as metrics.

`options` holds the flags and is all the CLI imports to build its parser; `sink` (gRPC, requests,
the OpenTelemetry SDK and the OTLP gencode) is imported only when the options turn the sink on.
See docs/otlp.md.
"""
