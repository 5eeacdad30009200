"""A real ``redis-server`` as a child process, for the shared-store tests and the replica soak:
started on a free loopback port in a temporary folder, without persistence, and stopped
afterwards. ``kill`` and ``start`` again on the same port stand for a store that dies and comes
back empty."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from coda.serving.procs import free_port

#: how long a started server may take to answer PING (it takes milliseconds; this only guards a hang)
START_TIMEOUT_S = 60.0


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
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._pings():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {START_TIMEOUT_S:g} s")
            time.sleep(0.02)

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
