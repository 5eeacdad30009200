"""What the trace loaders share: line-numbered streaming reads, one-line errors, drop accounting.

A trace row that cannot be parsed as its format is a user error (``file:line: field: problem``,
the fix named): it usually means the wrong ``--format`` or a corrupt file. A well-formed row that
describes something the simulator cannot replay (no output tokens, a duplicate round) is dropped
and counted by reason, so a loaded workload always says what it left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from coda.errors import CodaError
from coda.workload.schema import Round, Session, Workload, describe_decode_error, open_text


@dataclass
class LoadReport:
    """Rows read, and rows dropped or adjusted per reason (with the first line of each)."""

    source: str
    fmt: str
    rows: int = 0
    dropped: dict[str, list[int]] = field(default_factory=dict)  # reason -> [rows, first line]
    adjusted: dict[str, list[int]] = field(default_factory=dict)

    def drop(self, reason: str, lineno: int) -> None:
        _count(self.dropped, reason, lineno)

    def adjust(self, reason: str, lineno: int) -> None:
        _count(self.adjusted, reason, lineno)

    @property
    def dropped_rows(self) -> int:
        return sum(n for n, _ in self.dropped.values())

    def as_meta(self) -> dict[str, Any]:
        """The summary stored in the workload's metadata (and printed by the commands)."""
        return {
            "source": self.source,
            "format": self.fmt,
            "rows": self.rows,
            "kept_rows": self.rows - self.dropped_rows,
            "dropped": {r: {"rows": n, "first_line": line} for r, (n, line) in self.dropped.items()},
            "adjusted": {r: {"rows": n, "first_line": line} for r, (n, line) in self.adjusted.items()},
        }


def _count(table: dict[str, list[int]], reason: str, lineno: int) -> None:
    entry = table.setdefault(reason, [0, lineno])
    entry[0] += 1


def check_file(path: Path, fmt: str) -> None:
    if not path.exists():
        raise CodaError(f"{path}: no such {fmt} trace file; check the path")
    if path.is_dir():
        raise CodaError(f"{path}: is a directory; pass a {fmt} trace file")


def line_error(path: Path, lineno: int, where: str, problem: str, fmt: str) -> CodaError:
    return CodaError(f"{path}:{lineno}: {where}: {problem} (read with the {fmt} reader; pass --format to choose another)")


def jsonl_rows(path: Path, row_type: type, fmt: str) -> Iterator[tuple[int, Any]]:
    """Decode each non-blank line of a JSONL file (``.gz`` too) into ``row_type``, one at a time."""
    check_file(path, fmt)
    decoder = msgspec.json.Decoder(row_type)
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, decoder.decode(line)
            except msgspec.DecodeError as err:
                where, problem = describe_decode_error(err)
                raise line_error(path, lineno, "row" if where == "session" else where, problem, fmt) from None


def no_rows(path: Path, fmt: str, report: LoadReport) -> CodaError:
    why = f"all {report.rows} rows were dropped ({', '.join(report.dropped)})" if report.rows else "it holds no rows"
    return CodaError(f"{path}: no replayable request: {why} (read with the {fmt} reader; pass --format to choose another)")


def open_loop_workload(rows: list[tuple[float, int, int, int]], path: Path, fmt: str, report: LoadReport, prefix: str) -> Workload:
    """One-round sessions ready at their timestamps, from (time, input, output, line) rows in file order; the
    earliest row is time 0. Nothing is shared between requests (no prefix, no session)."""
    if not rows:
        raise no_rows(path, fmt, report)
    t0 = min(r[0] for r in rows)
    sessions = [
        Session(
            session_id=f"{prefix}-{line}",
            start_s=t - t0,
            rounds=[Round(new_input_tokens=n_in, output_tokens=n_out, kind="user", at_s=t - t0)],
        )
        for t, n_in, n_out, line in rows
    ]
    meta = {
        "source": fmt,
        "file": str(path),
        "duration_s": max(max(r[0] for r in rows) - t0, 1.0),
        "arrivals": "open loop: every request at its timestamp; one-round sessions, no shared prefixes",
        "load": report.as_meta(),
    }
    return Workload(sessions=sessions, meta=meta)
