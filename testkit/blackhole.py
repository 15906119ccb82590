"""A loopback TCP server that accepts connections, reads what comes and never answers: the slow,
hung collector of outage tests. Bounded: at most `max_connections` are held, reads are discarded."""

from __future__ import annotations

import selectors
import socket
import threading


class Blackhole:
    def __init__(self, max_connections: int = 64) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self.accepted = 0
        self._max = max_connections
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="blackhole", daemon=True)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        held: list[socket.socket] = []
        while not self._stop.is_set():
            for key, _ in sel.select(0.2):
                if key.fileobj is self._listener:
                    try:
                        conn, _ = self._listener.accept()
                    except BlockingIOError:
                        continue
                    self.accepted += 1
                    if len(held) >= self._max:
                        conn.close()
                        continue
                    conn.setblocking(False)
                    held.append(conn)
                    sel.register(conn, selectors.EVENT_READ)
                else:
                    conn = key.fileobj  # type: ignore[assignment]
                    try:
                        if not conn.recv(65536):
                            sel.unregister(conn)
                            held.remove(conn)
                            conn.close()
                    except OSError:
                        sel.unregister(conn)
                        held.remove(conn)
                        conn.close()
        for conn in held:
            conn.close()
        sel.close()

    def __enter__(self) -> Blackhole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()
