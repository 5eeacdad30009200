"""Start ``coda fake-engine`` as a subprocess on a free port (tests, benchmarks, the gateway's tests)."""

from __future__ import annotations

import subprocess
from types import TracebackType

from coda.serving.procs import Proc, spawn


class FakeEngineProcess:
    """``with FakeEngineProcess("--speedup", "10") as engine: engine.url`` — stopped with SIGTERM
    (uvicorn's graceful shutdown) on exit, SIGKILL if it does not stop within ``stop_timeout_s``."""

    def __init__(self, *args: str, startup_timeout_s: float = 120.0, stop_timeout_s: float = 10.0) -> None:
        self.args = args
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.url = ""
        self._proc: Proc | None = None
        self._stderr = ""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self._proc.popen if self._proc is not None else None

    def __enter__(self) -> FakeEngineProcess:
        try:
            self._proc = spawn("fake-engine", "--port", "0", *self.args, timeout_s=self.startup_timeout_s)
        except RuntimeError as err:
            raise RuntimeError(f"coda fake-engine did not start: {err}") from None
        self.url = self._proc.url
        return self

    def stderr(self) -> str:
        return self._proc.stderr() if self._proc is not None else self._stderr

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self._proc is not None:
            self._stderr = self._proc.stderr()
            self._proc.stop(timeout_s=self.stop_timeout_s)
