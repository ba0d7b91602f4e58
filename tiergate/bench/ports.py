"""Free loopback ports for the servers a benchmark starts."""

from __future__ import annotations

import socket


def free_ports(count: int = 1) -> list[int]:
    """Distinct free ports (the sockets stay bound until all are chosen)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
