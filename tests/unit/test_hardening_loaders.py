"""Bounded memory for every workload file: a line with no end, or a gzip that inflates past the
limits, is refused with one line (the file, the limit, the fix) while the loader holds at most a
small multiple of the line limit. Peaks are Python allocations (``tracemalloc``), asserted far
from both the limit's few MiB and the tens of MiB that reading the whole line would take."""

from __future__ import annotations

import gzip
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from coda.errors import CodaError
from coda.workload.limits import LINE_ENV, TOTAL_ENV
from coda.workload.spec import READERS, load_workload

MIB = 2**20
LINE_LIMIT = MIB
BIG = 48 * MIB  # no newline in it: held whole, it would cost 48 MiB of bytes and as much again as text


@pytest.fixture
def small_limits(monkeypatch):
    monkeypatch.setenv(LINE_ENV, str(LINE_LIMIT))
    monkeypatch.setenv(TOTAL_ENV, str(4 * MIB))


def endless_line(folder: Path, gz: bool) -> Path:
    path = folder / ("endless.jsonl.gz" if gz else "endless.jsonl")
    with gzip.open(path, "wb", compresslevel=1) if gz else path.open("wb") as fh:
        chunk = b'{"session_id":"' + b"a" * (MIB - 15)
        for _ in range(BIG // MIB):
            fh.write(chunk)
    return path


def peak_while_refused(path: Path, fmt: str | None) -> tuple[str, int]:
    tracemalloc.start()
    try:
        with pytest.raises(CodaError) as err:
            load_workload(str(path), fmt)
        return str(err.value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("fmt", [None, *READERS])
def test_a_line_with_no_end_is_refused_holding_a_few_times_the_line_limit(tmp_path, small_limits, fmt, gz):
    message, peak = peak_while_refused(endless_line(tmp_path, gz), fmt)
    assert LINE_ENV in message and str(LINE_LIMIT) in message and "endless.jsonl" in message
    assert peak < 8 * LINE_LIMIT, f"peak {peak / MIB:.1f} MiB"


def test_a_gzip_that_inflates_past_the_total_is_refused(tmp_path, small_limits):
    path = tmp_path / "blank.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(b"\n" * (16 * MIB))  # 16 KiB compressed; nothing but blank lines
    message, peak = peak_while_refused(path, None)
    assert TOTAL_ENV in message and "after decompression" in message
    assert peak < 8 * LINE_LIMIT


def test_the_command_line_refuses_in_one_line_with_exit_2(tmp_path):
    path = endless_line(tmp_path, gz=False)
    env = {LINE_ENV: str(LINE_LIMIT), "PATH": "/usr/bin:/bin", "COLUMNS": "400"}
    for args in (["workload", "stats", str(path)], ["sim", "-w", str(path)], ["workload", "stats", "--format", "azure", str(path)]):
        run = subprocess.run([sys.executable, "-m", "coda.cli", *args], capture_output=True, text=True, env=env, timeout=300)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and LINE_ENV in lines[0], run.stderr
    bad = subprocess.run([sys.executable, "-m", "coda.cli", "workload", "stats", str(path)], capture_output=True, text=True,
                         env={**env, LINE_ENV: "lots"}, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and LINE_ENV in bad.stderr
