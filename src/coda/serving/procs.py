"""Start ``coda`` servers (``fake-engine``, ``serve``) as child processes and wait until they print
``listening on URL``: the integration tests and benchmarks run real servers on loopback. A
process that exits before it listens raises with its stderr."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

_LISTENING = re.compile(r"listening on (http://\S+)")


class Proc:
    def __init__(self, popen: subprocess.Popen[bytes], log_dir: str) -> None:
        self.popen = popen
        self.url = ""
        self.log_dir = log_dir

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self, name: str) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.log_dir, name), errors="replace") as f:
            return f.read()
        return ""

    def stdout(self) -> str:
        return self._read("stdout")

    def stderr(self) -> str:
        return self._read("stderr")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Send ``sig`` and wait; a process still running after ``timeout_s`` is killed."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        shutil.rmtree(self.log_dir, ignore_errors=True)
        return self.popen.returncode


def spawn(*args: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> Proc:
    """``coda ARGS...`` in a child process (output to files); returns once it prints ``listening on URL``."""
    log_dir = tempfile.mkdtemp(prefix="coda-proc-")
    with open(os.path.join(log_dir, "stdout"), "wb") as out, open(os.path.join(log_dir, "stderr"), "wb") as err:
        popen = subprocess.Popen([sys.executable, "-m", "coda.cli", *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                 env={**os.environ, "COLUMNS": "400", **(env or {})})
    proc = Proc(popen, log_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = _LISTENING.search(proc.stdout())
        if m:
            proc.url = m.group(1)
            return proc
        if popen.poll() is not None:
            text = proc.stderr()
            proc.stop()
            raise RuntimeError(f"coda {' '.join(args)} exited with {popen.returncode} before listening:\n{text}")
        time.sleep(0.05)
    text = proc.stderr()
    proc.stop(signal.SIGKILL)
    raise RuntimeError(f"coda {' '.join(args)} did not listen within {timeout_s} s:\n{text}")


@contextlib.contextmanager
def running(*args: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> Iterator[Proc]:
    """``spawn`` as a context manager that always stops the process."""
    proc = spawn(*args, timeout_s=timeout_s, env=env)
    try:
        yield proc
    finally:
        proc.stop()


def free_port() -> int:
    """A loopback port nothing listens on now (for a child server told its port up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
