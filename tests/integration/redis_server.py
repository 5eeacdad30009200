"""The shared-store tests' real ``redis-server`` (``coda.serving.redis_server``) as a fixture,
skipping, saying why, where the binary is absent."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from coda.serving.procs import free_port  # noqa: F401 - the tests' port finder
from coda.serving.redis_server import RedisServer, started


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install -y redis-server); the shared-store tests need a real one")
    with started(binary, "coda-redis-") as server:
        yield server
