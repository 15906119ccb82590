"""A small Kubernetes API server on loopback for tests: TLS with a self-signed certificate (the CA file
a pod's service account has), a bearer token, and GET /api/v1/pods answering a PodList (filtered by
`fieldSelector=spec.nodeName=...`) or, with `watch=1`, streaming the changes after a resourceVersion
as the real server does (chunked JSON lines; an ERROR event with code 410 when that version is older
than the history kept, see `compact`)."""

from __future__ import annotations

import copy
import json
import ssl
import subprocess
import threading
import time
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


def authorized(header: str | None, token: str = TOKEN) -> bool:
    # The auth scheme is case-insensitive (RFC 9110 11.1).
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and given == token


class FakeApi:
    def __init__(self, tmp: Path, pods: list[dict[str, Any]] | None = None) -> None:
        self.pods = list(pods or [])
        self.requests: list[dict[str, Any]] = []
        self.fail = False
        self.token = TOKEN
        self.version = 1  # the resourceVersion of the last change
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (version, event type, pod) watchers replay
        self.oldest = 1  # a watch from before this version gets 410 Gone
        self.changed = threading.Condition()
        self.closed = False
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
            protocol_version = "HTTP/1.1"  # chunked watch streams

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                api.requests.append({"path": url.path, "query": query,
                                     "authorization": self.headers.get("Authorization")})
                if api.fail:
                    self.send_error(503)
                    return
                if url.path != "/api/v1/pods":
                    self.send_error(404)
                    return
                if not authorized(self.headers.get("Authorization"), api.token):
                    self.send_error(401)
                    return
                node = (query.get("fieldSelector") or [""])[0].removeprefix("spec.nodeName=")
                if (query.get("watch") or [""])[0] in ("1", "true"):
                    self.watch(node, int((query.get("resourceVersion") or ["0"])[0] or 0),
                               float((query.get("timeoutSeconds") or ["60"])[0]))
                    return
                with api.changed:
                    items = [p for p in api.pods if not node or p["spec"]["nodeName"] == node]
                    version = api.version
                body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": str(version)}, "items": items}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def watch(self, node: str, since: int, timeout: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                deadline = time.monotonic() + min(timeout, 60.0)
                with api.changed:
                    if since < api.oldest - 1:
                        self.event({"type": "ERROR", "object": {
                            "kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
                            "message": f"too old resource version: {since} ({api.oldest - 1})"}})
                    else:
                        while not api.closed and (left := deadline - time.monotonic()) > 0:
                            for version, kind, obj in api.history:
                                if version > since and (not node or obj["spec"]["nodeName"] == node):
                                    self.event({"type": kind, "object": obj})
                            since = api.version
                            api.changed.wait(left)
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

            def event(self, event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

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

    def change(self, kind: str, obj: dict[str, Any]) -> None:
        """A pod ADDED, MODIFIED or DELETED (matched by UID): in the list, and to every watch."""
        with self.changed:
            self.version += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.version)
            uid = obj["metadata"]["uid"]
            self.pods = [p for p in self.pods if p["metadata"]["uid"] != uid]
            if kind != "DELETED":
                self.pods.append(obj)
            self.history.append((self.version, kind, obj))
            self.changed.notify_all()

    def compact(self) -> None:
        """Forget the history: a watch from an older version is answered 410 Gone."""
        with self.changed:
            self.history.clear()
            self.oldest = self.version + 1

    def rotate_token(self, token: str) -> None:
        """A new service account token, on disk and as the only one accepted."""
        (self.service_account / "token").write_text(token)
        self.token = token

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()
