"""Test certificates made with the openssl command line."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def self_signed(key: Path, cert: Path, san: str = "IP:127.0.0.1") -> None:
    """A self-signed P-256 server certificate for CN=offcpu-test, valid two days."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-days", "2", "-subj", "/CN=offcpu-test", "-addext", f"subjectAltName={san}",
            "-keyout", str(key), "-out", str(cert))


@dataclass(frozen=True)
class Pki:
    """A test CA with a server certificate for 127.0.0.1 and a client certificate, all signed by it."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path  # signed by another CA: a server that trusts only `ca` refuses it
    other_client_key: Path


def _issue(directory: Path, name: str, ca_cert: Path, ca_key: Path, extensions: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    ext.write_text(extensions + "\n")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return cert, key


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign", "-keyout", str(key), "-out", str(cert))
    return cert, key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _ca(directory, "offcpu-test-ca")
    server_cert, server_key = _issue(directory, "server", ca_cert, ca_key,
                                     "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    client_cert, client_key = _issue(directory, "client", ca_cert, ca_key, "extendedKeyUsage=clientAuth")
    other_ca_cert, other_ca_key = _ca(directory, "other-ca")
    other_cert, other_key = _issue(directory, "intruder", other_ca_cert, other_ca_key, "extendedKeyUsage=clientAuth")
    return Pki(ca_cert, server_cert, server_key, client_cert, client_key, other_cert, other_key)
