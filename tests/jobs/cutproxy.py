"""FakeCuttingProxy: a fake network path for the client tests. A TCP proxy on loopback in
front of a server that cuts its first connections' answers after a number of body bytes,
as a dropped connection would (the answer ends mid-stream, without its last chunk)."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit


class FakeCuttingProxy:
    """``cuts``: for each new connection in turn, how many bytes of the answer's body (after
    its headers) to pass before closing it; connections after those pass everything."""

    def __init__(self, target: str, cuts: list[int] | None = None) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.cuts = list(cuts or [])
        self.requests: list[str] = []  # the request line of each request seen
        self.body_bytes: list[int] = []  # body bytes passed, per finished connection
        self.cut = 0  # connections cut
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def __enter__(self) -> FakeCuttingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                budget = self.cuts.pop(0) if self.cuts else None
            threading.Thread(target=self._serve, args=(client, budget), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if data[:8].split(b" ")[0] in (b"GET", b"POST", b"HEAD", b"PUT", b"DELETE"):
                    with self._lock:
                        self.requests.append(data.split(b"\r\n", 1)[0].decode())
                upstream.sendall(data)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def _serve(self, client: socket.socket, budget: int | None) -> None:
        upstream = socket.create_connection(self._target)
        threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
        head = b""
        body = 0  # body bytes passed (after the first answer's headers)
        in_body = False
        try:
            while data := upstream.recv(65536):
                if not in_body:
                    head += data
                    if b"\r\n\r\n" not in head:
                        continue
                    headers, data = head.split(b"\r\n\r\n", 1)
                    client.sendall(headers + b"\r\n\r\n")
                    in_body = True
                if budget is not None and body + len(data) >= budget:
                    client.sendall(data[: budget - body])
                    body = budget
                    with self._lock:
                        self.cut += 1
                    return
                client.sendall(data)
                body += len(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self.body_bytes.append(body)
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
