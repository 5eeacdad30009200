"""``coda serve --workers N``: N gateway processes (workers, here; not the engines) that accept on
one port and decide as one.

**One port, a socket per worker (SO_REUSEPORT).** The parent binds every socket before it forks
(a port in use or a bad host fails at once, in one line, before any worker starts), one per worker,
and the kernel spreads new connections over them by a hash of the client's address and port. One
socket inherited by every worker would share one accept queue, but the event loop accepts every
connection pending when it wakes, so the first worker to wake takes a whole burst; clients keep
their connections alive, so that worker then serves them all (measured: 32 clients connecting at
once left one of two workers 92% of the gateway's CPU). The hash spreads connections evenly,
whatever their load, which is what long-lived agent connections need. The port is first taken
without SO_REUSEPORT, so another server on it, even one that set SO_REUSEPORT too, is a port in use
rather than a silent share of its connections. Each worker closes every socket but its own, so a
worker that dies takes its socket out of the port (the connections queued on it are reset; the
server stops anyway, below).

**Shared state.** Each worker is a replica (``coda.gateway.replica``) named ``ID-0``, ``ID-1``, ...
(``ID``: ``store.replica_id``, else the parent's hostname-pid). With ``store.url`` the workers share
that store; without one the parent serves them a ``LocalStore`` over a Unix socket
(``coda.gateway.host_store``). Either way each worker is a replica on a shared store, so admission
counts, session slots and a session's home worker (``GatewayState.home_worker``) are the same in
every worker.

**Supervision.** SIGTERM or SIGINT to the parent is passed to every worker, which drains as a lone
gateway does (a second signal cuts at once); the parent exits 0 once they have. The workers run in
their own process group, so a terminal's Ctrl-C reaches the parent alone and is not counted twice.
A worker that exits on its own (a crash, the OOM killer) is reported in one line, and the parent
stops the others (they drain) and exits 1: whatever runs the gateway (systemd, Kubernetes) sees the
failure and restarts it with its own backoff and restart count, where a worker restarted in place
would hide a crash loop. A worker that cannot start (an engine that does not answer) stops them all
with its one-line error, exit 2. Each worker holds a socket to the parent, whose end of file, should
the parent be killed, makes the worker drain and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from coda.errors import CodaError
from coda.gateway.app import Gateway, serve
from coda.gateway.config import GatewayConfig
from coda.gateway.host_store import HOST_STORE_SCHEME, serve_host_store
from coda.gateway.replica import local_store
from coda.gateway.store import LocalStore
from coda.gateway.view import MAX_SESSION_SLOTS
from coda.serving.listen import event_loop_factory, listen
from coda.shell.build import build_policies
from coda.shell.sessions import ledger_of

log = logging.getLogger("coda.gateway")
#: the signals the parent passes to its workers
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


@dataclass
class Child:
    """One worker process, as its parent knows it."""

    index: int
    replica: str
    pid: int
    #: the parent's end of the worker's control socket: the worker writes ``ready URL`` or
    #: ``error MESSAGE``; end of file means it exited (and, the other way, that the parent did)
    ctl: socket.socket
    ready: bool = False
    error: str = ""
    #: reaped: its pid may belong to another process now, so it is sent no signal
    exited: bool = False

    def __str__(self) -> str:
        return f"gateway process {self.index} (replica {self.replica}, pid {self.pid})"


def per_worker(path: str | None, index: int) -> str | None:
    """A log file of worker ``index``: ``decisions.jsonl`` -> ``decisions.0.jsonl`` (``-``, stderr, is shared)."""
    if path is None or path == "-":
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{index}{p.suffix}"))


def worker_config(cfg: GatewayConfig, index: int, replica: str, store_url: str | None) -> GatewayConfig:
    """``cfg`` for worker ``index``: its replica id, the store, and log files of its own (each
    worker buffers its records, so two workers appending to one file could cut each other's lines).
    Copied without validation: the one-host store's address is the parent's to give, not a setting."""
    store = cfg.store.model_copy(update={"replica_id": replica, "url": store_url})
    access = cfg.access_log.model_copy(update={"path": per_worker(cfg.access_log.path, index)})
    return cfg.model_copy(update={"store": store, "access_log": access, "decision_log": per_worker(cfg.decision_log, index)})


def serve_workers(cfg: GatewayConfig, n: int, on_ready: Callable[[Gateway], None], on_listening: Callable[[str], None]) -> int:
    """Serve ``cfg`` with ``n`` worker processes until SIGTERM/SIGINT; returns the exit code (0, or
    1 when a worker died); a worker's startup error is raised as ``CodaError``. ``on_ready`` runs in
    each worker once it serves, ``on_listening`` in the parent (with the URL) once every worker does."""
    socks = _listeners(cfg.host, cfg.port, n)
    base = cfg.store.replica_id or f"{socket.gethostname()}-{os.getpid()}"
    folder = tempfile.mkdtemp(prefix="coda-store-") if cfg.store.url is None else None  # only this user may enter it
    host: tuple[LocalStore, socket.socket] | None = None  # the one-host store and its listening socket
    url = cfg.store.url
    if folder is not None:
        path = os.path.join(folder, "store.sock")
        host = _host_store(cfg), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        host[1].bind(path)
        host[1].listen(n)
        url = HOST_STORE_SCHEME + path
    # held until the parent's handlers are in place: a signal during startup is passed on, not lost
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        children: list[Child] = []
        for i in range(n):
            wcfg = worker_config(cfg, i, f"{base}-{i}", url)
            mine, theirs = socket.socketpair()
            sys.stdout.flush()  # nothing buffered is written twice
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                others = [s for j, s in enumerate(socks) if j != i] + [c.ctl for c in children] + [mine] + ([host[1]] if host else [])
                _worker(wcfg, socks[i], theirs, others, on_ready)
            theirs.close()
            socks[i].close()  # its worker holds it: once the worker has closed it, the port stops sending it connections
            children.append(Child(i, wcfg.store.replica_id or "", pid, mine))
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(_supervise(children, host, on_listening))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _listeners(host: str, port: int, n: int) -> list[socket.socket]:
    """``n`` listening sockets on one port (SO_REUSEPORT); the port is taken first without it, so one
    in use (by a server with SO_REUSEPORT too) is refused; ``port`` 0 picks a free one."""
    with listen(host, port) as probe:
        port = probe.getsockname()[1]
    return [listen(host, port, reuse_port=True) for _ in range(n)]


def _host_store(cfg: GatewayConfig) -> LocalStore:
    """The store the parent serves: session slots with the ingress policy's TTL, as a lone gateway keeps them."""
    ingress = build_policies(cfg.policy_spec, kinds=("ingress",)).ingress
    return local_store(cfg.store, ledger_of(ingress, MAX_SESSION_SLOTS), time.monotonic)


async def _supervise(children: list[Child], host: tuple[LocalStore, socket.socket] | None, on_listening: Callable[[str], None]) -> int:
    """Serve the one-host store (if any), wait for every worker to serve, pass stop signals on, and
    watch for a worker that exits; returns once every worker has exited."""
    loop = asyncio.get_running_loop()
    server = await serve_host_store(*host) if host is not None else None
    stopping = False
    failed: Child | None = None  # the first worker that exited on its own

    def stop() -> None:
        nonlocal stopping
        stopping = True
        for c in children:
            if not c.exited:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGTERM)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    async def watch(c: Child) -> None:
        nonlocal failed
        reader, writer = await asyncio.open_unix_connection(sock=c.ctl)
        async for line in reader:
            word, _, rest = line.decode().rstrip("\n").partition(" ")
            if word == "ready":
                c.ready = True
                if not stopping and all(x.ready for x in children):
                    on_listening(rest)
            else:
                c.error = rest
        writer.close()
        _, status = await asyncio.to_thread(os.waitpid, c.pid, 0)
        c.exited = True
        if host is not None:
            await host[0].drop(c.replica)  # its counts go now, not at their TTL
        if stopping:
            return
        failed = c
        if c.ready or not c.error:  # else its startup error is the server's, raised once every worker has stopped
            detail = f": {c.error}" if c.error else "" if c.ready else " before it served"
            log.error("%s %s%s; stopping the other gateway processes", c, _ended(status), detail)
        stop()

    await asyncio.gather(*(watch(c) for c in children))
    if server is not None:
        server.close()
    if failed is not None and not failed.ready and failed.error:
        raise CodaError(failed.error)
    return 1 if failed is not None else 0


def _ended(status: int) -> str:
    """How a process ended, from its wait status."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exited with code {code}"
    with contextlib.suppress(ValueError):  # a signal without a name (a real-time one)
        return f"was killed by {signal.Signals(-code).name}"
    return f"was killed by signal {-code}"


def _worker(cfg: GatewayConfig, sock: socket.socket, ctl: socket.socket, others: list[socket.socket],
            on_ready: Callable[[Gateway], None]) -> NoReturn:
    """A worker's whole life in the forked child: it never returns into the parent's code.
    ``others``: the sockets that are not this worker's (the other workers' listeners, the parent's
    ends of the control sockets, the store's listener), closed here: a listener held by a worker
    that never accepts on it would keep taking its share of connections, and each control socket
    must reach end of file when the parent exits."""
    code = 1
    try:
        for s in others:
            s.close()
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        code = _serve_worker(cfg, sock, ctl, on_ready)
    except BaseException:  # a bug: its traceback, then the exit the parent reports
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve_worker(cfg: GatewayConfig, sock: socket.socket, ctl: socket.socket, on_ready: Callable[[Gateway], None]) -> int:
    def ready(url: str, gw: Gateway) -> None:
        """Tell the parent; from now on the control socket closing means the parent is gone."""
        on_ready(gw)
        ctl.sendall(f"ready {url}\n".encode())
        asyncio.get_running_loop().add_reader(ctl.fileno(), _orphaned, ctl)

    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(serve(cfg, ready, sock))
    except KeyboardInterrupt:
        pass
    except (CodaError, OSError) as err:
        with contextlib.suppress(OSError):  # the parent may be gone
            ctl.sendall(f"error {' '.join(str(err).split())}\n".encode())
        return 2
    return 0


def _orphaned(ctl: socket.socket) -> None:
    """The parent never writes, so a readable control socket means it is gone: drain and exit, as on SIGTERM."""
    asyncio.get_running_loop().remove_reader(ctl.fileno())
    signal.raise_signal(signal.SIGTERM)
