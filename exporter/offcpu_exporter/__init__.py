"""offcpu-exporter: where threads wait, per stack, continuously."""

__version__ = "0.1.0"
