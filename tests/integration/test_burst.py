"""The agent burst's harness (`coda burst`), not its numbers: two fake engines, three
configurations at one load, every column present and the ratios computed from the rows, a rerun
on the same folder resumed from its cells; the simulator's rung; and the scenario's sessions
shaped as documented (cold share, bursts, round cap)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coda.bench.burst import Sessions, burst_workload, is_cold
from coda.bench.doors import cpu_s, group_cpu_s
from coda.bench.ladder import METRICS, RATIO_METRICS
from coda.metrics.intervals import median_ratio_ci

CODA = Path(sys.executable).with_name("coda")  # the console script pip installed, as a user runs it
ISSUE_KEYS = ("config", "load", "goodput", "ttft_p95_continuation_s", "ttft_p95_cold_s", "max_wait_s", "session_p99_s")


def fake_burst_cmd(out: Path, window_s: str = "3", knee: str = "1.5") -> list[str]:
    return [
        str(CODA),
        "burst",
        "--fake",
        "--configs",
        "plain,coda-gateway,coda-gateway+session",
        "--loads",
        "1",
        "--repeats",
        "2",
        "--knee-sessions-per-s",
        knee,
        "--window-s",
        window_s,
        "--drain-s",
        "5",
        "--cold-share",
        "0.2",
        "--tool-scale",
        "0.01",
        "--out",
        str(out),
        "--json",
    ]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("burst")
    proc = subprocess.run(fake_burst_cmd(out), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), out


def test_every_column_is_present_in_the_json_and_the_csv(result):
    res, out = result
    rows = res["rows"]
    assert [(r["config"], r["load"]) for r in rows] == [("plain", 1.0), ("coda-gateway", 1.0), ("coda-gateway+session", 1.0)]
    for row in rows:
        for key in (*ISSUE_KEYS, *METRICS, *(f"{m}_ci95" for m in METRICS)):
            assert key in row, key
        assert row["repeats"] == 2
        assert 0.0 <= row["goodput"] <= 1.0
        assert row["ttft_p95_continuation_s"] is not None and row["ttft_p95_cold_s"] is not None
    gateway = rows[1]
    for m in RATIO_METRICS:
        assert f"{m}_vs_plain" in gateway and f"{m}_vs_plain_ci95" in gateway
    assert rows[1]["door_cpu_pct"] is not None and rows[0]["door_cpu_pct"] is None  # plain has no door
    with (out / "rows.csv").open() as fh:
        header = next(csv.reader(fh))
    assert set(ISSUE_KEYS) <= set(header)
    assert (out / "burst.png").stat().st_size > 0
    # every replay's requests are kept, and why any was not served is counted
    for config in ("plain", "coda-gateway"):
        for rep in (0, 1):
            lines = (out / "logs" / f"{config}-r{rep}-1x.requests.jsonl").read_text().splitlines()
            assert lines and all(json.loads(line)["session_id"] for line in lines)
    assert "ingress admit_all" in (out / "logs" / "coda-gateway-r0-coda-serve.log").read_text()
    assert "ingress session" in (out / "logs" / "coda-gateway+session-r0-coda-serve.log").read_text()  # the named door ran
    for run in res["runs"]["plain@1"]:
        assert isinstance(run["not_served"], dict)
    # the door's own counts come from coda serve's /metrics; the symmetric measures from every replay
    assert rows[0]["inflight_peak"] is None and rows[0]["idle_while_held_s"] is None
    for row in rows[1:]:
        assert row["inflight_peak"] >= 1 and row["idle_while_held_s"] >= 0 and row["refused_while_idle"] >= 0
    for row in rows:
        assert 0.0 <= row["goodput_symmetric"] <= 1.0 and 0.0 <= row["session_goodput"] <= 1.0


def test_ratios_are_computed_from_the_rows_and_the_runs(result):
    res, _ = result
    plain, gateway, _ = res["rows"]
    for m in RATIO_METRICS:
        if plain[m]:
            assert gateway[f"{m}_vs_plain"] == pytest.approx(gateway[m] / plain[m], rel=1e-9)
    # each row's median is the median of its runs
    runs = res["runs"]["coda-gateway@1"]
    assert gateway["goodput"] == pytest.approx(float(np.median([r["goodput"] for r in runs])))


def test_a_rerun_on_the_same_out_keeps_every_saved_replay(result):
    """Each replay is saved as it finishes; a run pointed at that folder again replays nothing and
    reports the same rows (an interrupted long run resumes where it stopped)."""
    res, out = result
    proc = subprocess.run(fake_burst_cmd(out), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(proc.stdout)
    assert again["runs"] == res["runs"]
    assert again["rows"] == res["rows"]
    assert again["knee"] == res["knee"]


def test_group_cpu_counts_every_process_of_the_group_and_nothing_else():
    """The engines' CPU column sums a vLLM server's process group (API server and engine core)."""
    burn = "import sys; sum(range(30_000_000)); print('done', flush=True); sys.stdin.read()"
    spawn = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {burn!r}]); {burn}"
    child = subprocess.Popen(
        [sys.executable, "-c", spawn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert child.stdout.readline().strip() == "done"
        assert child.stdout.readline().strip() == "done"  # both the leader and its child have done the same work
        leader = cpu_s(child.pid)
        assert group_cpu_s(child.pid) >= leader + 0.5 * leader  # the child's share counts too (it did the leader's work)
        assert group_cpu_s(2**22 + 12345) == 0.0  # no such group: nothing
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the leader and its child
        child.wait()


def test_ratio_interval_brackets_the_ratio_of_medians():
    rng = np.random.default_rng(0)
    point, ci = median_ratio_ci([2.0, 2.2, 1.8], [1.0, 1.1, 0.9], rng)
    assert point == pytest.approx(2.0)
    assert ci[0] <= point <= ci[1]
    assert median_ratio_ci([1.0], [0.0], rng) == (None, None)


def test_the_scenario_has_its_cold_share_bursts_and_round_cap():
    sc = Sessions(cold_share=0.1, max_rounds=5, burst_period_s=10.0, burst_duty=0.3, window_s=60.0)
    wl = burst_workload(sc, 2.0, seed=3)
    requests = sum(len(s.rounds) for s in wl.sessions)
    cold = [s for s in wl.sessions if is_cold(s.session_id)]
    assert len(cold) / requests == pytest.approx(0.1, abs=0.01)
    assert all(len(s.rounds) == 1 and s.rounds[0].new_input_tokens == sc.cold_tokens for s in cold)
    assert all(len(s.rounds) <= 5 for s in wl.sessions)
    assert all(s.start_s % 10.0 <= 3.0 + 1e-6 for s in wl.sessions)  # arrivals only in the first 30% of each 10 s
    again = burst_workload(sc, 2.0, seed=3)
    assert [s.session_id for s in again.sessions] == [s.session_id for s in wl.sessions]


def simulated_cmd(out: Path, window_s: str = "5") -> list[str]:
    return [str(CODA), "burst", "--simulate", "vllm-cpu-tiny", "--configs", "plain,vllm-router,coda", "--repeats", "2",
            "--sim-sweep", "1,2", "--window-s", window_s, "--out", str(out), "--json"]


def test_a_rerun_with_other_settings_runs_its_own_cells_and_loses_none(tmp_path):
    """Cells are keyed by everything that determines them: a rerun on the same folder with another
    window runs anew, and every cell the first run kept is still there, unchanged (the simulator's
    rung here; replays on engines are cells of the same store)."""
    first = subprocess.run(simulated_cmd(tmp_path), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p: p.read_bytes() for p in (tmp_path / "cells").rglob("*") if p.is_file()}
    proc = subprocess.run(simulated_cmd(tmp_path, window_s="6"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["runs"] != json.loads(first.stdout)["runs"]
    after = {p: p.read_bytes() for p in (tmp_path / "cells").rglob("*") if p.is_file()}
    assert len(after) > len(before) and all(after.get(p) == data for p, data in before.items())


def test_the_simulated_burst_runs_every_configuration_it_models_at_both_loads(tmp_path):
    proc = subprocess.run(simulated_cmd(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    assert [lv["sessions_per_s"] for lv in res["knee"]["levels"]] == [1.0, 2.0]
    assert res["knee"]["knee_sessions_per_s"] in (1.0, 2.0)
    # vllm-router has no model in the simulator: left out, not faked
    assert [(r["config"], r["load"]) for r in res["rows"]] == [("plain", 0.5), ("plain", 2.0), ("coda", 0.5), ("coda", 2.0)]
    coda = res["rows"][3]
    assert coda["goodput_vs_plain"] == pytest.approx(coda["goodput"] / res["rows"][1]["goodput"], rel=1e-9)
    # every row says what its mechanisms did: plain has none, Tiered-Aging's W_max is counted (acted or inert)
    assert res["rows"][0]["liveness"]["mechanisms"] == [] and coda["liveness"]["mechanisms"] == ["w_max"]
    assert coda["liveness"]["w_max_admissions"] is not None and coda["liveness"]["uncounted"] == []


def test_a_given_knee_replaces_the_simulated_sweep(tmp_path):
    """``--knee-sessions-per-s`` on the simulator's rung runs the loads at that rate, as on engines,
    so a real run's knee can be replayed in the simulator at the real rates."""
    cmd = [str(CODA), "burst", "--simulate", "vllm-cpu-tiny", "--configs", "plain", "--repeats", "1", "--loads", "0.5,2",
           "--knee-sessions-per-s", "0.75", "--window-s", "5", "--out", str(tmp_path), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    assert res["knee"]["knee_sessions_per_s"] == 0.75 and res["knee"]["levels"] == []
    # sessions arrive at the loads times the given knee: at 0.375 sessions/s, of at most 8 rounds each
    # (and a few cold prompts), well under 4 requests/s; the simulated knee of this profile is tens of sessions/s
    low, high = (res["runs"][f"plain@{load}"][0]["offered_rps"] for load in ("0.5", "2"))
    assert 0 < low < 4 and low < high < 16
