"""Listening sockets for Coda's HTTP servers (the gateway and the fake engine)."""

from __future__ import annotations

import socket

from coda.errors import CodaError


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket created with ``IPPROTO_TCP``, so that asyncio sets TCP_NODELAY on every
    accepted connection (``socket.create_server`` leaves the protocol at 0, and Nagle's algorithm
    then holds a stream's first chunk for the client's delayed ACK: up to 40 ms added to TTFT).
    A port in use or a bad address is a one-line ``CodaError``."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise CodaError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock
