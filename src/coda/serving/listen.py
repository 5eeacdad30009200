"""Listening sockets for Coda's HTTP servers (the gateway and the fake engine), and the event loop
the gateway runs on."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from coda.errors import CodaError


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket created with ``IPPROTO_TCP``, so that asyncio sets TCP_NODELAY on every
    accepted connection (``socket.create_server`` leaves the protocol at 0, and Nagle's algorithm
    then holds a stream's first chunk for the client's delayed ACK: up to 40 ms added to TTFT).
    ``reuse_port``: SO_REUSEPORT, so that several sockets share the port (``coda serve --workers``).
    A port in use or a bad address is a one-line ``CodaError``."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise CodaError(f"--host {host}: not an address to listen on ({getattr(err, 'strerror', None) or err}); pass an IP address "
                        "of this machine or a name it resolves, e.g. 127.0.0.1 or 0.0.0.0") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise CodaError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (every platform but Windows): its selector,
    transports and callbacks run in C, where asyncio's are Python code run for every relayed chunk
    (most of a proxy's CPU beside HTTP parsing); ``None`` (asyncio's own loop) elsewhere."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
