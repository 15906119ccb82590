"""Test certificates made with the openssl command line."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def self_signed(key: Path, cert: Path, san: str = "IP:127.0.0.1") -> None:
    """A self-signed P-256 server certificate for CN=offcpu-test, valid two days."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-days", "2", "-subj", "/CN=offcpu-test", "-addext", f"subjectAltName={san}",
            "-keyout", str(key), "-out", str(cert))
