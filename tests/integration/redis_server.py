"""A real ``redis-server`` for the tests: started on a free loopback port in a temporary folder,
without persistence, and stopped afterwards. ``kill`` and ``start`` again on the same port stand
for a store that dies and comes back empty. Tests skip, saying why, where the binary is absent."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, binary: str, folder: Path) -> None:
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)

    def _pings(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.ConnectionError:
            return False

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._pings, f"redis-server on port {self.port} answers PING")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.proc = None


@contextmanager
def started(binary: str, prefix: str) -> Iterator[RedisServer]:
    """A running server in a fresh temporary folder, killed (and the folder removed) on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        server = RedisServer(binary, Path(folder))
        server.start()
        try:
            yield server
        finally:
            server.kill()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install -y redis-server); the shared-store tests need a real one")
    with started(binary, "coda-redis-") as server:
        yield server
