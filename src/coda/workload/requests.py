"""Per-request JSONL of a serving benchmark: one request a line with its input tokens, output
tokens and arrival time, as vLLM benchmark harnesses write them.

Field names vary between harnesses; each column takes the first of its names present:

* input tokens: ``input_toks``, ``input_tokens``, ``prompt_len``, ``prompt_tokens``, ``input_len``
* output tokens: ``output_toks``, ``output_tokens``, ``output_len``, ``completion_tokens``
* arrival: ``arrival_time``, ``arrival_s``, ``timestamp`` (seconds; the earliest becomes 0)

Open loop: every row is a one-round session ready at its arrival, nothing shared between them;
other fields (a harness's measured timestamps) are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coda.workload.schema import Workload, open_text
from coda.workload.traceio import LoadReport, check_file, line_error, open_loop_workload

FORMAT = "requests"
INPUT = ("input_toks", "input_tokens", "prompt_len", "prompt_tokens", "input_len")
OUTPUT = ("output_toks", "output_tokens", "output_len", "completion_tokens")
ARRIVAL = ("arrival_time", "arrival_s", "timestamp")


def _field(row: dict[str, Any], names: tuple[str, ...], path: Path, lineno: int, kind: type) -> float:
    for name in names:
        if name in row:
            value = row[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and float(value) != int(value)):
                raise line_error(path, lineno, name, f"{value!r} is not {'an integer' if kind is int else 'a number'}", FORMAT)
            if value < 0:
                raise line_error(path, lineno, name, f"{value!r} cannot be negative", FORMAT)
            return float(value)
    raise line_error(path, lineno, "row", f"no {names[0]} (or {', '.join(names[1:])}) field", FORMAT)


def read_requests(path: Path) -> Workload:
    """Read a per-request benchmark JSONL into one-round open-loop sessions."""
    path = Path(path)
    check_file(path, FORMAT)
    report = LoadReport(str(path), FORMAT)
    rows: list[tuple[float, int, int, int]] = []
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            report.rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise line_error(path, lineno, "json", f"not valid JSON ({err.msg})", FORMAT) from None
            if not isinstance(row, dict):
                raise line_error(path, lineno, "row", "not a JSON object", FORMAT)
            t = _field(row, ARRIVAL, path, lineno, float)
            n_in, n_out = int(_field(row, INPUT, path, lineno, int)), int(_field(row, OUTPUT, path, lineno, int))
            if n_in == 0 or n_out == 0:
                report.drop("no input or no output tokens (a replayed request reads and generates at least one)", lineno)
                continue
            rows.append((t, n_in, n_out, lineno))
    return open_loop_workload(rows, path, FORMAT, report, "req")


def looks_like_requests(path: Path, first_line: str) -> bool:
    return any(f'"{k}"' in first_line for k in INPUT) and any(f'"{k}"' in first_line for k in ARRIVAL)
