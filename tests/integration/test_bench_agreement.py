"""Agreement: `coda bench` against `coda fake-engine` measures what `coda sim` predicts for the
same workload (TTFT, TBT and throughput within 10%), since both run the same worker, scheduler
and cost model; the token counts the engine saw are exactly the trace's.

TBT is compared as the mean inter-token gap (the quantity the TBT SLO bounds); the median of the
pooled gaps within 15%: on a shared 2-core machine the OS sometimes runs the engine or the client
late, so a late token is followed by an early one, which moves the median of the gaps (by 8% in
our runs under a load average of 4) but not their mean. A run during which
the host froze the engine or the client for more than 0.2 s (seen for 3-4 s at a time on a loaded
VM, both processes at once) is measured again, and the test is skipped if that happens twice."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from coda.engines.launch import FakeEngineProcess
from coda.workload.schema import Round, Session, Workload, write_workload

DURATION_S = 18.0
STALL_S = 0.2


def agreement_workload(seed: int = 0) -> Workload:
    """Five sessions of eight rounds started 1.5 s apart: 2.5-3.5K-token first prompts, 2-3K appended
    per round, 80-160 output tokens, 0.5-1 s tools. Prefills rarely collide, so a few milliseconds of
    HTTP and timer jitter cannot cascade into a different schedule (with multi-second prefills
    colliding, the simulator itself moves by 15% under 30 ms of jitter)."""
    rng = np.random.default_rng(seed)
    sessions = []
    for i in range(5):
        rounds = [
            Round(new_input_tokens=int(rng.integers(2500, 3500) if k == 0 else rng.integers(2000, 3000)), output_tokens=int(rng.integers(80, 160)),
                  kind="user" if k == 0 else "tool_followup", tool_duration_s=round(float(rng.uniform(0.5, 1.0)), 3))
            for k in range(8)
        ]
        sessions.append(Session(session_id=f"agree-{i}", start_s=1.5 * i, rounds=rounds))
    return Workload(sessions=sessions, meta={"source": "agreement test", "seed": seed, "duration_s": DURATION_S})


def coda_json(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "coda.cli", *args, "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def engine_late_s(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return max(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("coda:fake_engine_late_max_seconds"))


def test_bench_on_the_fake_engine_agrees_with_the_simulator(tmp_path):
    path = tmp_path / "agreement.jsonl"
    write_workload(agreement_workload(), path)
    sim = coda_json("sim", "--workload", str(path), "--workers", "1", "--seed", "0", "--out", str(tmp_path / "sim"))
    warmup, end = sim["window_s"]
    stalls = []
    for attempt in range(2):  # a host that freezes both processes for seconds makes timing meaningless: measure again
        with FakeEngineProcess("--speedup", "1") as engine:
            bench = coda_json("bench", "--endpoint", engine.url, "--workload", str(path), "--warmup-s", str(warmup), "--duration", str(end),
                              "--drain-s", "30", "--out", str(tmp_path / "bench"))
            late = engine_late_s(engine.url)
        if max(late, bench["client_lag_max_s"]) < STALL_S:
            break
        stalls.append(f"attempt {attempt + 1}: engine {late:.2f} s late, client loop {bench['client_lag_max_s']:.2f} s late")
    else:
        pytest.skip("the machine stalled the engine or the client past 0.2 s in both attempts (" + "; ".join(stalls) + ")")
    rows = {key: (sim[key], bench[key], bench[key] / sim[key] - 1) for key in ("ttft_p50_s", "tbt_mean_s", "output_tps", "tbt_p50_s")}
    print("\n".join(f"{k}: sim {s:.4g} bench {b:.4g} ({d:+.1%})" for k, (s, b, d) in rows.items()))
    # A round that becomes ready within a few milliseconds of the window's end may fall either side.
    assert abs(bench["completed"] - sim["completed"]) <= 2 and sim["completed"] > 15 and bench["failed"] == bench["rejected"] == 0
    for key, (_, _, diff) in rows.items():
        assert abs(diff) <= (0.15 if key == "tbt_p50_s" else 0.10), f"{key} differs by {diff:+.1%}"
    sim_records = {(r["session_id"], r["round"]): r for r in map(json.loads, (tmp_path / "sim" / "requests.jsonl").read_text().splitlines())}
    for r in map(json.loads, (tmp_path / "bench" / "requests.jsonl").read_text().splitlines()):
        if r["state"] == "completed":
            assert r["server_prompt_tokens"] == r["prompt_tokens"] == r["trace_prompt_tokens"]
            assert r["output_tokens"] == r["trace_output_tokens"]
            s = sim_records[(r["session_id"], r["round"])]  # the engine hit the prefixes the simulator hit
            assert r["hbm_hit_tokens"] == s["hbm_hit_tokens"] + s["dram_hit_tokens"] + s["ssd_hit_tokens"]
