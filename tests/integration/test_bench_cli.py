"""`coda bench` and `coda fake-engine` as a user runs them: the --json contract, the files written,
sweeps with repeats and a knee, Ctrl-C writing what was measured, one-line errors (exit 2)."""

from __future__ import annotations

import csv
import io
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from coda.bench.report import flat
from coda.engines.launch import FakeEngineProcess
from tests.waiting import wait_until

JSON_ORDER = ("offered", "completed", "rejected", "failed", "goodput", "output_tps", "slo_tps", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s",
              "e2e_p50_s", "config")
JSON_KEYS = set(JSON_ORDER)
SMALL = "synth:rate=6,duration=60,seed=1"  # 4 sessions; with --time-scale 0.05 a 3 s arrival window


def coda(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coda.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def engine():
    with FakeEngineProcess("--speedup", "20") as eng:
        yield eng


def test_json_contract_and_files(engine, tmp_path):
    proc = coda(
        "bench", "--endpoint", engine.url, "--workload", SMALL, "--time-scale", "0.05", "--drain-s", "20", "--out", str(tmp_path), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert JSON_KEYS <= out.keys() and out["offered"] == out["completed"] > 0 and out["goodput"] > 0
    cfg = out["config"]
    assert cfg["model"] == "coda-fake" and cfg["time_scale"] == 0.05 and cfg["workload"]["spec"] == SMALL and cfg["workload"]["seed"] == 1
    assert cfg["slo"] == {"ttft_s": 5.0, "tbt_s": 0.1} and "api_key" not in cfg and out["versions"]["coda"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["offered"] == out["offered"]
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) >= out["offered"] and all(json.loads(line)["state"] == "completed" for line in lines)
    for name in ("latency_cdf.png", "throughput.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_completions_api_sends_the_same_tokens_as_a_prompt_string(engine, tmp_path):
    proc = coda(
        "bench",
        "--endpoint",
        engine.url + "/v1",
        "--workload",
        SMALL,
        "--time-scale",
        "0.05",
        "--max-sessions",
        "2",
        "--api",
        "completions",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["completed"] > 0
    for r in map(json.loads, (tmp_path / "requests.jsonl").read_text().splitlines()):
        assert r["state"] == "completed" and r["server_prompt_tokens"] == r["prompt_tokens"] == r["trace_prompt_tokens"]


def test_options_come_from_a_config_file_and_flags_win(engine, tmp_path):
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(
        f"endpoint: {engine.url}\nworkload: '{SMALL}'\nout: {tmp_path / 'out'}\ntime_scale: 0.05\ndrain_s: 20\n"
        "max_sessions: 2\nslo: {ttft_s: 2.5, tbt_s: 0.05}\n"
    )
    proc = coda("bench", "--config", str(cfg), "--slo-tbt-s", "0.2", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["config"]["slo"] == {"ttft_s": 2.5, "tbt_s": 0.2} and out["config"]["sessions_started"] == 2
    assert (tmp_path / "out" / "summary.json").exists()
    cfg.write_text(cfg.read_text() + "colour: blue\n")
    bad = coda("bench", "--config", str(cfg), "--json")
    assert bad.returncode == 2 and "colour" in bad.stderr and bad.stderr.count("\n") == 1


def test_sweep_repeats_each_rate_and_reports_the_knee(engine, tmp_path):
    proc = coda(
        "bench",
        "--endpoint",
        engine.url,
        "--workload",
        SMALL,
        "--time-scale",
        "0.05",
        "--drain-s",
        "20",
        "--sweep",
        "2,6",
        "--repeats",
        "3",
        "--out",
        str(tmp_path),
        "--json",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert [r["rate"] for r in res["rows"]] == [2.0, 6.0] and all(r["repeats"] == 3 for r in res["rows"])
    assert res["knee_rate"] in (2.0, 6.0) and res["rows"][0]["goodput_ci95"] is not None
    assert (tmp_path / "load.png").exists() and (tmp_path / "sweep.json").exists()
    assert sorted(p.parent.name for p in tmp_path.glob("rate-6/*/summary.json")) == ["repeat-0", "repeat-1", "repeat-2"]
    seeds = {json.loads(p.read_text())["config"]["workload"]["seed"] for p in tmp_path.glob("rate-2/*/summary.json")}
    assert seeds == {1, 2, 3}  # each repeat is another synthetic draw


def max_overlap(records: list[dict]) -> int:
    """The most requests in flight at once, from each completed request's send and end times."""
    edges = sorted((t, d) for r in records if r["state"] == "completed" for t, d in ((r["sent_s"], 1), (r["end_s"], -1)))
    inflight = peak = 0
    for _, d in edges:
        inflight += d
        peak = max(peak, inflight)
    return peak


def test_sweep_concurrency_runs_n_sessions_at_a_time_and_reports_the_knee(engine, tmp_path):
    proc = coda(
        "bench",
        "--endpoint",
        engine.url,
        "--workload",
        SMALL,
        "--time-scale",
        "0.05",
        "--drain-s",
        "20",
        "--sweep-concurrency",
        "1,3",
        "--out",
        str(tmp_path),
        "--json",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert (
        res["axis"] == "concurrency" and [r["concurrency"] for r in res["rows"]] == [1, 3] and all(r["repeats"] == 3 for r in res["rows"])
    )
    assert res["knee_concurrency"] in (1, 3) and "itl_p50_s" in res["rows"][0]
    peaks = {}
    for level in (1, 3):
        for path in sorted(tmp_path.glob(f"concurrency-{level}/repeat-*/")):
            assert json.loads((path / "summary.json").read_text())["config"]["max_concurrency"] == level
            records = [json.loads(line) for line in (path / "requests.jsonl").read_text().splitlines()]
            peaks.setdefault(level, []).append(max_overlap(records))
            if level == 1:  # one session after another: each starts once the previous one has ended
                sessions = sorted(
                    {r["session_id"] for r in records}, key=lambda sid: min(r["ready_s"] for r in records if r["session_id"] == sid)
                )
                for a, b in zip(sessions, sessions[1:]):
                    assert min(r["ready_s"] for r in records if r["session_id"] == b) >= max(
                        r["end_s"] for r in records if r["session_id"] == a
                    )
    assert peaks[1] == [1, 1, 1] and max(peaks[3]) == 3
    header = (tmp_path / "sweep.csv").read_text().splitlines()[0].split(",")
    assert header == list(res["rows"][0])  # the JSON's columns


def test_csv_prints_the_summary_with_the_json_columns(engine, tmp_path):
    proc = coda(
        "bench",
        "--endpoint",
        engine.url,
        "--workload",
        SMALL,
        "--time-scale",
        "0.05",
        "--max-concurrency",
        "2",
        "--drain-s",
        "20",
        "--out",
        str(tmp_path),
        "--csv",
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = list(csv.DictReader(io.StringIO(proc.stdout)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(row) == set(flat(summary)) and list(row)[: len(JSON_KEYS) - 1] == [k for k in JSON_ORDER if k != "config"]
    assert int(row["offered"]) == summary["offered"] and row["config.workload.spec"] == SMALL and row["config.max_concurrency"] == "2"
    assert (tmp_path / "summary.csv").read_text().splitlines()[0].split(",") == list(flat(summary))


def test_scrape_metrics_samples_the_engine_over_the_whole_run(engine, tmp_path):
    proc = coda(
        "bench",
        "--endpoint",
        engine.url,
        "--workload",
        SMALL,
        "--time-scale",
        "0.05",
        "--drain-s",
        "20",
        "--scrape-metrics",
        "--scrape-interval-s",
        "0.2",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    server = json.loads(proc.stdout)["server"][engine.url]
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    done = [r for r in records if r["state"] == "completed"]
    assert server["errors"] == 0 and server["samples"] >= 3 and 0 <= server["kv_usage_mean"] <= server["kv_usage_max"] <= 1
    # counter deltas span the run: the engine's prefix-cache hits are the cached tokens its answers reported
    assert server["prefix_hits_delta"] + server["external_prefix_hits_delta"] == sum(r["hbm_hit_tokens"] for r in done)
    if server["preemptions_delta"] == 0:  # a preempted request is queried again
        assert server["prefix_queries_delta"] == sum(r["server_prompt_tokens"] for r in done)
    (series,) = json.loads((tmp_path / "server_metrics.json").read_text())
    t = series["t_s"]
    assert t == sorted(t) and len(t) == len(series["waiting"]) == len(series["kv_usage"]) == len(series["prefix_hit_rate"])
    assert t[0] <= min(r["sent_s"] for r in done) and t[-1] >= max(r["end_s"] for r in done)
    assert max(series["running"]) >= 1 and all(h is None or 0 <= h <= 1 for h in series["prefix_hit_rate"])
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_an_engine_without_metrics_stops_a_scraping_run_before_it_starts(engine, tmp_path):
    with busy_port() as sock:
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed again below: nothing listens there
    proc = coda(
        "bench",
        "--endpoint",
        engine.url,
        "--workload",
        SMALL,
        "--out",
        str(tmp_path),
        "--scrape-metrics",
        "--metrics-endpoint",
        dead,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: --scrape-metrics:") and dead in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "summary.json").exists()


def requests_seen(url: str) -> float:
    """Prompt tokens the engine has taken in (vLLM's counter), from its /metrics."""
    lines = [ln for ln in httpx.get(url + "/metrics").text.splitlines() if ln.startswith("vllm:prompt_tokens_total")]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_ctrl_c_writes_what_was_measured(engine, tmp_path):
    before = requests_seen(engine.url)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coda.cli",
            "bench",
            "--endpoint",
            engine.url,
            "--workload",
            "synth:rate=20,duration=600,seed=2",
            "--out",
            str(tmp_path),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: proc.poll() is not None or requests_seen(engine.url) > before, "the bench's first request reaches the engine")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    summary = json.loads(out)
    assert summary["ended_early"] and summary["window_s"][1] < 600 and summary["offered"] > 0  # cut short of the 600 s workload
    assert summary["offered"] == summary["completed"] + summary["rejected"] + summary["failed"]
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert {r["reason"] for r in records if r["state"] == "failed"} <= {"interrupted"}
    assert (tmp_path / "summary.json").exists()


def busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("bench", "--workload", SMALL, "--out", "x"), "--endpoint is required"),
        (("bench", "--endpoint", "http://127.0.0.1:9", "--workload", "synth:rate=-1,duration=5", "--out", "x"), "rate must be > 0"),
        (("bench", "--endpoint", "http://127.0.0.1:9", "--workload", SMALL, "--out", "x", "--api", "grpc"), "api"),
        (
            ("bench", "--endpoint", "http://127.0.0.1:9", "--workload", SMALL, "--out", "x", "--sweep", "2,4", "--repeats", "2"),
            "--repeats must be >= 3",
        ),
        (("bench", "--endpoint", "http://127.0.0.1:9", "--workload", SMALL, "--out", "x", "--sweep", "fast"), "comma-separated"),
        (
            ("bench", "--endpoint", "http://127.0.0.1:9", "--workload", SMALL, "--out", "x", "--sweep-concurrency", "1,2.5"),
            "integer concurrencies",
        ),
        (
            (
                "bench",
                "--endpoint",
                "http://127.0.0.1:9",
                "--workload",
                SMALL,
                "--out",
                "x",
                "--sweep",
                "1,2",
                "--sweep-concurrency",
                "1,2",
            ),
            "two sweeps",
        ),
        (("bench", "--endpoint", "http://127.0.0.1:9", "--workload", SMALL, "--out", "x", "--max-concurrency", "0"), "max_concurrency"),
        (("bench", "--endpoint", "http://127.0.0.1:9", "--workload", SMALL, "--out", "x", "--json", "--csv"), "choose one"),
        (("bench", "--endpoint", "http://127.0.0.1:9", "--workload", SMALL, "--out", "x", "--profile", "bogus"), "unknown profile 'bogus'"),
        (("fake-engine", "--port", "0", "--system", "coda"), "eviction policy tool_aware needs"),
        (("fake-engine", "--port", "0", "--system", "nope"), "unknown system 'nope'"),
        (("fake-engine", "--port", "0", "--speedup", "0"), "speedup"),
        (("fake-engine", "--port", "0", "--kv-events", "tcp://*:notaport"), "KV events: cannot open"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args, needle, tmp_path):
    proc = coda(*args, timeout=60, cwd=tmp_path)  # a relative --out lands in the test's folder
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and proc.stderr.startswith("error:") and proc.stderr.count("\n") == 1  # one line, no traceback


def test_a_port_in_use_is_a_one_line_error():
    with busy_port() as sock:
        proc = coda("fake-engine", "--port", str(sock.getsockname()[1]), timeout=60)
    assert proc.returncode == 2 and "cannot listen on 127.0.0.1" in proc.stderr and "Traceback" not in proc.stderr


def test_the_table_shows_the_task_metrics_and_says_why_slowdown_is_missing(engine, tmp_path):
    args = ("bench", "--endpoint", engine.url, "--workload", SMALL, "--time-scale", "0.05", "--max-sessions", "2", "--out", str(tmp_path))
    plain = coda(*args)
    assert plain.returncode == 0, plain.stderr
    assert "task_time_p50_s" in plain.stdout and "slowdown: none: pass --profile" in plain.stdout.replace("\n", " ")
    with_profile = coda(*args, "--profile", "vllm-cpu-tiny", "--json")
    assert with_profile.returncode == 0, with_profile.stderr
    out = json.loads(with_profile.stdout)
    assert out["tasks"] >= 1 and out["slowdown_p50"] > 0 and out["ttft_max_s"] >= out["ttft_p99_s"]
