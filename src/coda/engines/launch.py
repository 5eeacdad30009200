"""Start ``coda fake-engine`` as a subprocess on a free port (tests, benchmarks, the gateway's tests)."""

from __future__ import annotations

import re
import select
import subprocess
import sys
import tempfile
import time
from types import TracebackType


class FakeEngineProcess:
    """``with FakeEngineProcess("--speedup", "10") as engine: engine.url`` — stopped with SIGTERM
    (uvicorn's graceful shutdown) on exit, SIGKILL if it does not stop within ``stop_timeout_s``."""

    def __init__(self, *args: str, startup_timeout_s: float = 30.0, stop_timeout_s: float = 10.0) -> None:
        self.args = args
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")

    def __enter__(self) -> FakeEngineProcess:
        cmd = [sys.executable, "-m", "coda.cli", "fake-engine", "--port", "0", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline()
                found = re.search(r"http://\S+", line)
                if found:
                    self.url = found.group(0)
                    return self
            if self.proc.poll() is not None:
                break
        err = self.stderr().strip()
        self.__exit__(None, None, None)
        raise RuntimeError(f"coda fake-engine did not start: {err or 'no output'}")

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        self._stderr.close()
