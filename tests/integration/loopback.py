"""An ASGI app served by uvicorn on a free loopback port, in a thread: the real HTTP server that
integration tests script to stand in for an engine or a backend."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp

from tests.waiting import wait_until


@contextmanager
def serve(app: ASGIApp, log_level: str = "warning") -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL. The server must stop at the end."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the loopback server started")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive(), "the loopback server did not stop"
