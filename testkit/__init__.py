"""What the tests and the benchmarks share: real peers on loopback (OTLP, SkyWalking OAP, Prometheus
helpers), the exporter as a process or in-process, synthetic snapshots, the in-memory kernel-maps
fake, the workloads with known blocking times and the unwinder's kernel harness. Not shipped in
the package."""
