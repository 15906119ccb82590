"""The Prometheus output: `/metrics` on the exporter's web server, always on; `options` holds its
flags, `sink` the sink, `collector` and `exposition` what a scrape runs. Metric names and labels are
listed in docs/prometheus.md."""
