"""Everything Coda writes as JSON is strict JSON (no NaN or Infinity, which JSON.parse, Go and jq
reject): `--json` outputs, summary.json, requests.jsonl and the gateway's decision log, read back
with a parser that refuses those constants."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.serving.procs import running
from coda.shell import strict_json

SMALL = "synth:rate=6,duration=60,seed=1"


def _reject(constant: str) -> float:
    raise ValueError(f"not JSON: {constant}")


def strict(text: str) -> object:
    return json.loads(text, parse_constant=_reject)


def strict_lines(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert lines, f"{path} is empty"
    return [strict(line) for line in lines]  # type: ignore[misc]


def coda(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "coda.cli", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_non_finite_numbers_are_written_as_null():
    obj = {
        "inf": math.inf,
        "nan": math.nan,
        "np": np.float64(-np.inf),
        "arr": np.array([1.5, np.nan]),
        "int": np.int64(3),
        "path": Path("/x"),
    }
    assert strict(strict_json.dumps(obj)) == {"inf": None, "nan": None, "np": None, "arr": [1.5, None], "int": 3, "path": "/x"}
    assert strict(strict_json.dumps(obj, indent=2)) == strict(strict_json.dumps(obj))


def test_sim_and_compare_outputs_are_strict_json(tmp_path):
    strict(coda("sim", "--workload", "synth:rate=1,duration=120,seed=1", "--workers", "2", "--json", "--out", str(tmp_path / "sim")))
    strict((tmp_path / "sim" / "summary.json").read_text())
    strict((tmp_path / "sim" / "occupancy.json").read_text())
    strict_lines(tmp_path / "sim" / "requests.jsonl")
    res = strict(
        coda(
            "compare", "--workload", "synth:rate=1,duration=120,seed=1", "--systems", "vllm,coda", "--json", "--out", str(tmp_path / "cmp")
        )
    )
    assert [r["system"] for r in res["rows"]] == ["vllm", "coda"]  # type: ignore[index]
    strict((tmp_path / "cmp" / "compare.json").read_text())


def test_the_gateway_decision_log_and_bench_outputs_are_strict_json(tmp_path):
    """A request with no deadline has an infinite deadline slack: the log says null."""
    log = tmp_path / "decisions.jsonl"
    with FakeEngineProcess("--speedup", "20") as engine:
        cfg = tmp_path / "coda.yaml"
        cfg.write_text(yaml.safe_dump({"backends": [engine.url], "decision_log": str(log)}))
        with running("serve", "--config", str(cfg), "--port", "0") as gw:
            r = httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "coda-fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                timeout=30,
            )
            assert r.status_code == 200, r.text
        # the log is flushed when the gateway stops
        (record,) = strict_lines(log)
        assert record["action"] == "admit" and record["signals"]["deadline_slack_s"] is None
        out = tmp_path / "bench"
        summary = strict(coda("bench", "--endpoint", engine.url, "--workload", SMALL, "--time-scale", "0.05", "--out", str(out), "--json"))
    assert summary["completed"] > 0  # type: ignore[index]
    strict((out / "summary.json").read_text())
    assert {r["state"] for r in strict_lines(out / "requests.jsonl")} == {"completed"}
