"""Hypothesis: every command that reads or writes a file, given random bytes, a truncated gzip, a
directory or a path it cannot write, fails with one ``error:`` line and exit code 2 (or, for
bytes that happen to be a valid input, succeeds), never with a traceback. The commands run in
process through the ``coda`` entry point, as the console script runs them."""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.cli import main
from coda.workload.schema import write_workload
from coda.workload.spec import load_workload

SPEC = "synth:rate=0.5,duration=4,seed=0"
DEAD_ENDPOINT = "http://127.0.0.1:9"
# commands that read the file at {IN} (workload, config, profile, skew CSV), each with where it writes
READERS = {
    "workload stats": ["workload", "stats", "{IN}"],
    "sim workload": ["sim", "-w", "{IN}"],
    "sim config": ["sim", "-w", SPEC, "-c", "{IN}"],
    "subsample": ["workload", "subsample", "{IN}", "--rate", "1", "--out", "{DIR}/sub.jsonl"],
    "characterize": ["characterize", "{IN}", "--out", "{DIR}/findings"],
    "bench": ["bench", "-e", DEAD_ENDPOINT, "-w", "{IN}", "--out", "{DIR}/bench"],
    "profile show": ["profile", "show", "--profile", "{IN}"],
    "profile check": ["profile", "check", "--skew", "{IN}"],
}
SUFFIXES = {"profile show": ".json", "profile check": ".csv", "sim config": ".yaml"}
# commands that write at {OUT}: a directory (d) or a file (f)
WRITERS = {
    "sim": (["sim", "-w", SPEC, "--out", "{OUT}"], "d"),
    "compare": (["compare", "-w", SPEC, "--systems", "vllm", "--out", "{OUT}"], "d"),
    "characterize": (["characterize", SPEC, "--out", "{OUT}"], "d"),
    "bench": (["bench", "-e", DEAD_ENDPOINT, "-w", SPEC, "--out", "{OUT}"], "d"),
    "workload synth": (["workload", "synth", "--rate", "1", "--duration", "4", "--out", "{OUT}"], "f"),
    "workload subsample": (["workload", "subsample", "{IN}", "--rate", "1", "--out", "{OUT}"], "f"),
}


def run(args: list[str]) -> tuple[int, str]:
    """``coda ARGS`` in this process: (exit code, stderr)."""
    err = io.StringIO()
    argv = sys.argv
    sys.argv = ["coda", *args]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    finally:
        sys.argv = argv
    return code, err.getvalue()


def assert_refused_in_one_line(code: int, err: str, args: list[str]) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 0:
        return  # the bytes were a valid input
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), f"coda {' '.join(args)} -> exit {code}:\n{err[-3000:]}"


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Path:
    """A small valid workload, plain and gzipped, to cut short."""
    folder = tmp_path_factory.mktemp("valid")
    wl = load_workload(SPEC)
    write_workload(wl, folder / "w.jsonl")
    write_workload(wl, folder / "w.jsonl.gz")
    return folder


def _fill(args: list[str], **paths: Path) -> list[str]:
    return [a.format(**{k: str(v) for k, v in paths.items()}) for a in args]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(READERS)), kind=st.sampled_from(["bytes", "truncated gzip", "directory"]),
       data=st.binary(min_size=1, max_size=512), cut=st.floats(0.0, 0.99))
def test_a_bad_input_file_is_one_error_line(tmp_path, valid, command, kind, data, cut):
    # a fresh folder per example: two examples can share command, kind, size and cut
    case = Path(tempfile.mkdtemp(prefix=f"{command}-{kind}-".replace(" ", "_"), dir=tmp_path))
    if kind == "directory":
        src = case / "input"
        src.mkdir()
    elif kind == "truncated gzip":
        full = (valid / "w.jsonl.gz").read_bytes()
        src = case / "input.jsonl.gz"
        src.write_bytes(full[: int(cut * len(full))])
    else:
        src = case / ("input" + SUFFIXES.get(command, ".jsonl"))
        src.write_bytes(data)
    args = _fill(READERS[command], IN=src, DIR=case)
    assert_refused_in_one_line(*run(args), args)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(WRITERS)), kind=st.sampled_from(["kind mismatch", "under a file", "cannot create"]))
def test_an_output_path_that_cannot_be_written_is_one_error_line(tmp_path, valid, command, kind):
    args, wants = WRITERS[command]
    case = tmp_path / f"{command}-{kind}".replace(" ", "_")
    case.mkdir(exist_ok=True)
    blocker = case / "a_file"
    blocker.write_text("x")
    if kind == "kind mismatch":  # a file where a directory goes, a directory where a file goes
        out = blocker if wants == "d" else case
    elif kind == "under a file":
        out = blocker / "out"
    else:
        out = Path("/proc/coda-no-such-dir/out")
    filled = _fill(args, OUT=out, IN=valid / "w.jsonl")
    code, err = run(filled)
    assert code == 2, f"coda {' '.join(filled)} -> exit {code}:\n{err[-3000:]}"
    assert_refused_in_one_line(code, err, filled)


def test_subsample_refuses_to_overwrite_its_input(tmp_path, valid):
    src = tmp_path / "w.jsonl"
    src.write_bytes((valid / "w.jsonl").read_bytes())
    code, err = run(["workload", "subsample", str(src), "--rate", "1", "--out", str(src)])
    assert code == 2 and "is the input file too" in err
    assert src.read_bytes() == (valid / "w.jsonl").read_bytes()
