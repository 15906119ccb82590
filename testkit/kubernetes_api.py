"""A small Kubernetes API server on loopback for tests: TLS with a self-signed certificate (the CA file
a pod's service account has), a bearer token, and GET /api/v1/pods answering a PodList."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

NODE = "node-a"
TOKEN = "test-token-1"


def pod(uid: str, namespace: str, name: str, containers: dict[str, str], labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, runtime: str = "containerd") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": namespace, "name": name, "labels": labels or {},
                     "annotations": annotations or {}},
        "spec": {"nodeName": NODE},
        "status": {"containerStatuses": [
            {"name": n, "containerID": f"{runtime}://{cid}"} for cid, n in containers.items()
        ]},
    }


def authorized(header: str | None) -> bool:
    # The auth scheme is case-insensitive (RFC 9110 11.1); the client sends "bearer <token>".
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and token == TOKEN


class FakeApi:
    def __init__(self, tmp: Path, pods: list[dict[str, Any]] | None = None) -> None:
        self.pods = list(pods or [])
        self.requests: list[dict[str, Any]] = []
        self.fail = False
        cert, key = tmp / "server.crt", tmp / "server.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=60,
        )
        self.service_account = tmp / "serviceaccount"
        self.service_account.mkdir()
        (self.service_account / "token").write_text(TOKEN)
        (self.service_account / "ca.crt").write_bytes(cert.read_bytes())
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                api.requests.append({"path": url.path, "query": parse_qs(url.query),
                                     "authorization": self.headers.get("Authorization")})
                if api.fail:
                    self.send_error(503)
                    return
                if url.path != "/api/v1/pods":
                    self.send_error(404)
                    return
                if not authorized(self.headers.get("Authorization")):
                    self.send_error(401)
                    return
                body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": "1"}, "items": api.pods}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def environ(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.server.server_address[1]), "NODE_NAME": NODE}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
