"""Run a sweep's cells serially, on local worker processes or on a Ray cluster.

A cell is one independent piece of work (a system on a workload and seed, as one variant) that
returns a JSON value. Results come back in the cells' order whatever order they finished in, and
every result goes through the same JSON round trip whether it was computed now, on another
process, on another machine or read back from the store, so every way of running a sweep merges
the same values into the same output. A cell that raises is reported with its configuration and
error after the others finish.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from coda.errors import CodaError
from coda.shell import strict_json
from coda.sweep.store import CellStore, cell_key


@dataclass(frozen=True)
class Cell:
    """One unit of a sweep. ``config`` is everything that determines the result (its store key
    and what a failure report shows); ``run`` computes the result, a JSON value; ``weight`` is
    its simulated seconds, what the progress bar's ETA is a rate of."""

    label: str
    config: Mapping[str, Any]
    run: Callable[[], Any]
    weight: float = 1.0

    @property
    def key(self) -> str:
        return cell_key(self.config)


@dataclass(frozen=True)
class SweepOptions:
    """How to run a sweep: ``jobs`` local processes (None: one per core), or on Ray when ``ray``
    is given (``""``: a Ray instance started on this machine; else a cluster address); finished
    cells are kept in ``store`` and, with ``resume``, read back instead of run again."""

    jobs: int | None = None
    ray: str | None = None
    store: Path | None = None
    resume: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise CodaError(f"--jobs must be at least 1 (local worker processes), got {self.jobs}")


SERIAL = SweepOptions(jobs=1, progress=False)


@dataclass
class Failure:
    label: str
    config: Mapping[str, Any]
    error: str


class SweepFailed(CodaError):
    """Some cells raised; the others finished (and were stored). Exit code 1: not a usage error."""

    exit_code = 1

    def __init__(self, failures: list[Failure], total: int, stored: bool) -> None:
        self.failures = failures
        lines = [f"{len(failures)} of {total} cells failed" + ("; the others are stored, rerun to retry only these" if stored else "")]
        lines += [f"  {f.label} ({strict_json.dumps(f.config)}): {f.error}" for f in failures]
        super().__init__("\n".join(lines))


@dataclass
class _Outcome:
    index: int
    value: Any = None
    error: str | None = None
    where: str = ""


@dataclass
class _Tally:
    """What the progress bar shows."""

    total: int
    done: int = 0
    running: int = 0
    last: str = ""
    where: set[str] = field(default_factory=set)


def normalized(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples as lists, NaN as null, numpy as lists)."""
    return msgspec.json.decode(strict_json.dumps(value))


def _host() -> str:
    return socket.gethostname()


def _attempt(cell: Cell, index: int) -> _Outcome:
    try:
        return _Outcome(index, normalized(cell.run()), where=_host())
    except Exception as err:  # noqa: BLE001 - a cell's failure is reported, the sweep goes on
        last = traceback.extract_tb(err.__traceback__)[-1]
        return _Outcome(index, error=f"{type(err).__name__}: {err} (at {Path(last.filename).name}:{last.lineno})", where=_host())


# The cells of the running local sweep, installed in each worker process before it takes tasks:
# a forked worker inherits them without pickling (so cells may close over workloads and objects).
_CELLS: Sequence[Cell] = ()


def _install(cells: Sequence[Cell]) -> None:
    global _CELLS
    _CELLS = cells


def _run_index(index: int) -> _Outcome:
    return _attempt(_CELLS[index], index)


def _serial(cells: Sequence[Cell], todo: list[int], tally: _Tally) -> Iterator[_Outcome]:
    for i in todo:
        tally.running, tally.last = 1, cells[i].label
        yield _attempt(cells[i], i)


def _local(cells: Sequence[Cell], todo: list[int], jobs: int, tally: _Tally) -> Iterator[_Outcome]:
    """Worker processes, forked where the platform can (cells are inherited), else spawned (cells pickled)."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(min(jobs, len(todo)), initializer=_install, initargs=(cells,), maxtasksperchild=None) as pool:
        tally.running = min(jobs, len(todo))
        for n, outcome in enumerate(pool.imap_unordered(_run_index, todo, chunksize=1), start=1):
            tally.running = min(jobs, len(todo) - n)
            yield outcome


def _ray_cell(cell: Cell, index: int) -> _Outcome:
    return _attempt(cell, index)


#: longest wait for a Ray address to accept a connection before the sweep is refused: assumed (a
#: cluster on the same network answers in milliseconds; ray.init itself retries for minutes)
RAY_CONNECT_TIMEOUT_S = 10.0
#: the port Ray listens on when an address names none: the GCS's, or the Ray client server's for ray://
RAY_PORTS = {"": 6379, "ray": 10001}


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The host and port ``ray.init(address)`` connects to, or ``None`` where Ray finds the cluster
    itself (``auto``, or no address: a local instance)."""
    scheme, _, rest = address.rpartition("://")
    if not rest or rest == "auto" or scheme not in RAY_PORTS:
        return None
    host, colon, port = rest.rstrip("/").rpartition(":")
    if not colon or not port.isdigit() or host.endswith(":"):  # no port, or a bare IPv6 address
        host, port = rest.rstrip("/"), str(RAY_PORTS[scheme])
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A one-line ``CodaError`` unless the Ray address accepts a TCP connection within ``timeout_s``."""
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else err.strerror or str(err)
        raise CodaError(
            f"--ray {address}: cannot reach {endpoint[0]}:{endpoint[1]} within {timeout_s:g} s ({why}); pass a running "
            "cluster's address (ray status prints it), or --ray alone for a Ray instance on this machine"
        ) from None


def _ray(cells: Sequence[Cell], todo: list[int], address: str, tally: _Tally) -> Iterator[_Outcome]:
    """One Ray task per cell (one CPU each); ``address`` "" starts a local instance unless this
    process is already connected to one."""
    import ray
    if not ray.is_initialized():
        check_reachable(address)
        try:
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise CodaError(f"--ray {address}: cannot connect ({err}); pass a running cluster's address, "
                            "or no address for a local one") from None
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_cell)
    pending = {remote.remote(cells[i], i): i for i in todo}
    while pending:
        tally.running = len(pending)
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            i = pending.pop(ref)
            try:
                yield ray.get(ref)
            except Exception as err:  # noqa: BLE001 - a lost worker or node fails its cell, not the sweep
                yield _Outcome(i, error=f"{type(err).__name__} on Ray: {str(err).splitlines()[0] if str(err) else ''}")


def _progress(enabled: bool, title: str):  # noqa: ANN202 - a rich Progress, imported lazily
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from coda.console import err_console

    return Progress(
        TextColumn(f"[bold]{title}[/bold]"),
        BarColumn(),
        TextColumn("{task.fields[done]}/{task.fields[total_cells]} cells, {task.fields[running]} running"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[last]}"),
        console=err_console,
        transient=True,
        disable=not (enabled and err_console.is_terminal),
    )


def run_cells(cells: Sequence[Cell], options: SweepOptions = SERIAL, *, title: str = "sweep",
              on_result: Callable[[Cell, Any], Any] | None = None) -> list[Any]:
    """Every cell's result, in the cells' order. Stored cells are read back (with ``resume``);
    the others run as ``options`` say, and each is stored as it finishes. ``on_result(cell,
    value)`` sees each fresh result in the calling process and returns what to keep and store
    (e.g. with per-request records written to files and dropped). Raises ``SweepFailed`` after
    the rest finish when any cell failed."""
    store = CellStore(options.store) if options.store is not None else None
    results: list[Any] = [None] * len(cells)
    todo = []
    for i, cell in enumerate(cells):
        got = store.get(cell.key) if store is not None and options.resume else None
        if got is None:
            todo.append(i)
        else:
            results[i] = got
    tally = _Tally(total=len(cells), done=len(cells) - len(todo))
    failures: list[Failure] = []
    jobs = options.jobs or os.cpu_count() or 1
    if not todo:
        outcomes: Iterator[_Outcome] = iter(())
    elif options.ray is not None:
        outcomes = _ray(cells, todo, options.ray, tally)
    elif jobs == 1 or len(todo) == 1:
        outcomes = _serial(cells, todo, tally)
    else:
        outcomes = _local(cells, todo, jobs, tally)
    with _progress(options.progress, title) as prog:
        task = prog.add_task(title, total=sum(cells[i].weight for i in todo) or 1.0, done=tally.done, total_cells=tally.total,
                             running=0, last="")
        for out in outcomes:
            cell = cells[out.index]
            tally.done += 1
            if out.where:
                tally.where.add(out.where)
            if out.error is not None:
                failures.append(Failure(cell.label, cell.config, out.error))
            else:
                value = normalized(on_result(cell, out.value)) if on_result is not None else out.value
                results[out.index] = value
                if store is not None:
                    store.put(cell.key, cell.label, cell.config, value)
            where = f" on {out.where}" if options.ray is not None and out.where else ""
            prog.update(task, advance=cell.weight, done=tally.done, running=tally.running, last=f"last: {cell.label}{where}")
            if options.progress and prog.disable:  # off a terminal (a log file): one line per cell instead of the bar
                print(f"[{tally.done}/{tally.total}] {cell.label}{where}: {'failed' if out.error else 'done'}", file=sys.stderr, flush=True)
    if failures:
        raise SweepFailed(failures, len(cells), store is not None)
    return results
