"""benchmarks/fidelity_replay.py on a small recorded run: every statistic, its error, and one clear
line for a run without measured times."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = [{"arrival_time": 0.0, "input_toks": 500, "output_toks": 20, "ttft_ms": 60.0, "latency_ms": 250.0},
       {"arrival_time": 0.5, "input_toks": 1500, "output_toks": 50, "ttft_s": 0.12, "tpot_s": 0.01, "latency_s": 0.8},
       {"arrival_time": 0.7, "input_toks": 100, "output_toks": 1, "ttft": 0.03, "latency": 0.03}]


def replay(tmp_path: Path, rows: list[dict], *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fidelity_replay.py"), "--requests", str(path), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("setup", ["tp2", "dp2-ep"])
def test_every_statistic_is_reported_with_its_error(tmp_path, setup):
    proc = replay(tmp_path, RUN, "--setup", setup, "--json", str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "out.json").read_text())
    stats = report["statistics"]
    assert set(stats) == {f"{m}_{q}_s" for m in ("ttft", "tpot", "e2e") for q in ("mean", "p50", "p90", "p95", "p99")}
    assert stats["ttft_mean_s"]["real"] == pytest.approx((0.06 + 0.12 + 0.03) / 3)
    assert stats["tpot_mean_s"]["real"] == pytest.approx(((0.25 - 0.06) / 19 + 0.01) / 2)  # the one-token request has none
    assert stats["tpot_mean_s"]["requests"] == 2
    for v in stats.values():
        assert v["error"] == pytest.approx(v["sim"] / v["real"] - 1)
    assert report["config"]["profile"].startswith("rtxpro6000") and report["engine_time"]


def test_a_run_without_measured_times_is_one_line(tmp_path):
    proc = replay(tmp_path, [{"arrival_time": 0.0, "input_toks": 500, "output_toks": 20}])
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "TTFT and latency" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
