"""On-demand profiles over HTTP: ``/debug/pprof/offcpu?seconds=N`` returns a gzip pprof of the
next N seconds, as Go's net/http/pprof does for CPU, so that
``go tool pprof http://HOST:PORT/debug/pprof/offcpu?seconds=30``, Parca and Grafana Alloy read it;
``/flamegraph?minutes=N`` shows the last N minutes from the in-memory snapshot history as an
interactive flame graph.

`options` holds the flags, `sink` the HTTP handlers.
"""
