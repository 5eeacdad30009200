"""Bounded reading of trace and workload files: a line longer than ``CODA_MAX_LINE_BYTES`` or a
file longer than ``CODA_MAX_INPUT_BYTES`` (counted after decompression) is refused with one line
before it is held in memory, so a file with no newline or a small gzip bomb costs at most a small
multiple of the line limit, never the whole file.

Both defaults are assumed, sized with room to spare over the largest inputs known to load: a
Coda session line with block hashes for a hundred rounds of long prompts is a few MiB; the public
traces (TraceLab, Mooncake, Azure) are at most a few hundred MiB uncompressed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from coda.errors import CodaError

LINE_ENV, TOTAL_ENV = "CODA_MAX_LINE_BYTES", "CODA_MAX_INPUT_BYTES"
DEFAULT_LINE_BYTES = 64 * 2**20
DEFAULT_TOTAL_BYTES = 8 * 2**30


@dataclass(frozen=True, slots=True)
class InputLimits:
    line_bytes: int = DEFAULT_LINE_BYTES
    total_bytes: int = DEFAULT_TOTAL_BYTES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InputLimits:
        env = os.environ if environ is None else environ
        return cls(_positive(env, LINE_ENV, DEFAULT_LINE_BYTES), _positive(env, TOTAL_ENV, DEFAULT_TOTAL_BYTES))


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) == 0:
        raise CodaError(f"{name}={raw!r}: not a positive number of bytes; unset it (default {default}) or give one, e.g. {default}")
    return int(raw)


def bounded_lines(fh: BinaryIO, path: Path, limits: InputLimits) -> Iterator[str]:
    """The lines of ``fh`` as text (``\\r\\n`` read as ``\\n``), each read with at most
    ``limits.line_bytes + 1`` bytes held; one line naming the file, the limit and the fix when a
    limit is passed, or when a line is not UTF-8."""
    total = 0
    lineno = 0
    while line := fh.readline(limits.line_bytes + 1):
        lineno += 1
        total += len(line)
        if len(line) > limits.line_bytes and not line.endswith(b"\n"):
            raise CodaError(
                f"{path}:{lineno}: a line longer than {limits.line_bytes} bytes ({LINE_ENV}); this is no trace or workload "
                f"file Coda reads (pass the right file), or set {LINE_ENV} higher"
            )
        if total > limits.total_bytes:
            raise CodaError(
                f"{path}: more than {limits.total_bytes} bytes{' after decompression' if path.suffix == '.gz' else ''} "
                f"({TOTAL_ENV}); pass a smaller file, or set {TOTAL_ENV} higher"
            )
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CodaError(
                f"{path}:{lineno}: not UTF-8 text (byte {err.start + 1} of the line is {line[err.start:err.start + 1]!r}); pass a "
                "text file"
            ) from None
        yield text[:-2] + "\n" if text.endswith("\r\n") else text
