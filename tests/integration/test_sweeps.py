"""`coda compare` on worker processes and on a real Ray cluster prints and writes what the serial
run does (wall-clock fields aside), and a sweep killed halfway resumes to the same result."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import wait_until

SMALL = "synth:rate=1,duration=300,seed=3"
ARGS = ("compare", "--workload", SMALL, "--systems", "vllm,coda", "--seeds", "3", "--workers", "2", "--json")
#: what a run measures of itself, not of the simulation: the only fields allowed to differ
WALL_CLOCK = ("wall_s", "speed_x")


def coda(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "coda.cli", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"coda {' '.join(args)} failed ({proc.returncode}): {proc.stderr}"
    return proc


def without_wall_clock(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if k not in WALL_CLOCK}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def run_files(out: Path) -> dict[str, Any]:
    """Every file a compare wrote under ``out`` but the cell store, JSON ones without wall-clock fields."""
    files = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and "cells" not in p.relative_to(out).parts:
            text = p.read_text()
            files[str(p.relative_to(out))] = without_wall_clock(json.loads(text)) if p.suffix == ".json" else text
    return files


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("serial")
    return coda(*ARGS, "--jobs", "1", "--out", str(out)).stdout, out


def test_jobs_2_prints_and_writes_what_the_serial_run_does(serial, tmp_path):
    text, out = serial
    got = coda(*ARGS, "--jobs", "2", "--out", str(tmp_path)).stdout
    assert without_wall_clock(json.loads(got)) == without_wall_clock(json.loads(text))
    assert run_files(tmp_path) == run_files(out)
    assert len(list((tmp_path / "cells").glob("*.json.gz"))) == 6


def test_a_sweep_killed_halfway_resumes_to_the_uninterrupted_result(serial, tmp_path):
    text, out = serial
    proc = subprocess.Popen([sys.executable, "-m", "coda.cli", *ARGS, "--jobs", "1", "--out", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: any((tmp_path / "cells").glob("*.json.gz")), "the first finished cell in the store")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    stored = len(list((tmp_path / "cells").glob("*.json.gz")))
    assert 0 < stored < 6, "the kill came after the sweep finished: nothing left to resume"
    resumed = coda(*ARGS, "--jobs", "1", "--out", str(tmp_path)).stdout
    assert without_wall_clock(json.loads(resumed)) == without_wall_clock(json.loads(text))
    assert run_files(tmp_path) == run_files(out)


def test_a_real_ray_cluster_runs_the_cells_to_the_serial_result(serial, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'coda[ray]' to run the Ray executor test")
    text, out = serial
    # a Ray cluster of two CPUs on loopback, started here; the command connects to it by address
    ctx = ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", configure_logging=False)
    try:
        got = coda(*ARGS, "--ray", ctx.address_info["gcs_address"], "--out", str(tmp_path)).stdout
    finally:
        ray.shutdown()
    assert without_wall_clock(json.loads(got)) == without_wall_clock(json.loads(text))
    assert run_files(tmp_path) == run_files(out)


@pytest.mark.parametrize(
    ("flags", "says"), [(("--jobs", "0"), "--jobs must be at least 1"), (("--jobs", "2", "--ray"), "--jobs and --ray: give one")]
)
def test_bad_sweep_options_are_one_line_exit_2(flags, says):
    proc = subprocess.run(
        [sys.executable, "-m", "coda.cli", "compare", "--workload", SMALL, *flags], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and says in proc.stderr, proc.stderr


def test_a_workload_no_cell_can_read_is_one_line_exit_2_before_any_run(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"bad": 1}\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coda.cli",
            "compare",
            "--workload",
            str(bad),
            "--format",
            "coda",
            "--systems",
            "vllm,coda",
            "--jobs",
            "2",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "bad.jsonl" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "cells").exists()
