"""Loopback ports: free ones for the servers a benchmark, the tuner or the local stack
starts, and whether something already answers on one."""

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


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``port`` (a server started, or one left
    running by an earlier stack)."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def free_port() -> int:
    """One free port."""
    return free_ports()[0]
