"""Azure LLM inference traces (``Azure/AzurePublicDataset``): CSV of ``TIMESTAMP,ContextTokens,GeneratedTokens``.

Open loop with no session or prefix information: every row is a one-round session ready at its
timestamp (seconds from the earliest row), so nothing is reused across requests.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from coda.workload.schema import Workload, open_text
from coda.workload.traceio import LoadReport, check_file, line_error, open_loop_workload

FORMAT = "azure"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure(path: Path) -> Workload:
    """Read an Azure LLM inference CSV, streaming, into one-round open-loop sessions."""
    path = Path(path)
    check_file(path, FORMAT)
    report = LoadReport(str(path), FORMAT)
    rows: list[tuple[float, int, int, int]] = []  # (time, context, generated, line)
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise line_error(path, 1, "header", f"missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}", FORMAT)
        cols = [header.index(c) for c in COLUMNS]
        for fields in reader:
            lineno = reader.line_num
            if not fields:
                continue
            report.rows += 1
            if len(fields) != len(header):
                raise line_error(path, lineno, "row", f"{len(fields)} fields, the header has {len(header)}", FORMAT)
            stamp, context, generated = (fields[i] for i in cols)
            try:
                t = datetime.fromisoformat(stamp).timestamp()
            except ValueError:
                raise line_error(path, lineno, "TIMESTAMP", f"{stamp!r} is not a date-time", FORMAT) from None
            try:
                c, g = int(context), int(generated)
            except ValueError:
                raise line_error(
                    path, lineno, "ContextTokens/GeneratedTokens", f"{context!r}, {generated!r} are not integers", FORMAT
                ) from None
            if c < 0 or g < 0:
                raise line_error(path, lineno, "ContextTokens/GeneratedTokens", f"{c}, {g}: token counts cannot be negative", FORMAT)
            if c == 0 or g == 0:
                report.drop("ContextTokens or GeneratedTokens is 0 (a replayed round reads and generates at least one token)", lineno)
                continue
            rows.append((t, c, g, lineno))
    return open_loop_workload(rows, path, FORMAT, report, FORMAT)


def looks_like_azure(path: Path, first_line: str) -> bool:
    return all(c in first_line for c in COLUMNS)
