"""The installed `coda` command on usage mistakes: one `error:` line naming the input and the fix,
exit 2, never a traceback; `--version`; `coda bench` failing (not exiting 0) when it measured
nothing, and before it starts when the endpoint does not answer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coda import __version__
from coda.engines.launch import FakeEngineProcess

CODA = Path(sys.executable).with_name("coda")  # the console script pip installed, as a user runs it
SMALL = "synth:rate=6,duration=60,seed=1"


def coda(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CODA), *args], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})


def assert_one_error_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["sim", "--sytem", "x"], ["No such option: --sytem", "--system", "`coda sim --help`"]),
        (["sim", "--workers", "abc"], ["'--workers'", "valid integer", "`coda sim --help`"]),
        (["workload", "synth", "--rate", "1"], ["Missing option '--duration'", "`coda workload synth --help`"]),
        (["bogus"], ["No such command 'bogus'", "`coda --help`"]),
        (["compare", "--seeds", "0"], ["--seeds must be an integer from 1 to", "got 0"]),
        (["compare", "--systems", ",", "-w", SMALL], ["systems: none given", "--systems vllm,coda"]),
        (["sim", "--workers", "100000000", "-w", SMALL], ["workers", "less than or equal to 4096"]),
        (["serve", "--host", "999.1.1.1", "-b", "http://127.0.0.1:9"], ["--host 999.1.1.1", "pass an IP address"]),
        (["burst", "--fake", "--simulate", "vllm-cpu-tiny"], ["--simulate and --fake", "give one rung"]),
        (["burst", "--loads", "a"], ["--loads a", "comma-separated numbers", "--loads 0.5,1,2,4"]),
        (["burst", "--configs", "nope"], ["--configs: unknown nope", "valid: plain"]),
        (["burst", "--simulate", "nosuch"], ["--simulate nosuch", "unknown profile"]),
        (["burst", "--fake", "--configs", "coda"], ["--endpoints/--fake", "pass --configs"]),
        (["burst", "--vllm-cpu", "2", "--jobs", "2"], ["--jobs/--ray", "one at a time"]),
        (["burst", "--variant", "nope"], ["--variant nope: unknown", "valid: tool-pauses"]),
    ],
    ids=["unknown-flag", "bad-type", "missing-option", "unknown-command", "zero-seeds", "no-systems", "too-many-workers", "bad-host",
         "burst-two-rungs", "burst-loads", "burst-config", "burst-profile", "burst-fake-engine-config", "burst-jobs-on-engines",
         "burst-variant"],
)
def test_a_usage_error_is_one_line_with_the_fix_and_exit_2(args, needles):
    proc = coda(*args)
    assert_one_error_line(proc, 2, *needles)
    assert proc.stdout == ""


def test_zero_seeds_from_a_config_file_is_an_error_too(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seeds: 0\n")
    assert_one_error_line(coda("compare", "--config", str(cfg)), 2, "--seeds")


@pytest.mark.parametrize(("params", "needle"), [
    ({"name": "queue_limit", "params": {"max_waiting": -1}}, "max_waiting must be >= 1, got -1"),
    ({"name": "overload", "params": {"max_inflight": -3}}, "max_inflight must be >= 1, got -3"),
    ({"name": "overload", "params": {"max_inflight": "lots"}}, "max_inflight='lots' must be an integer"),
    ({"name": "session", "params": {"max_sessions": -2}}, "max_sessions must be >= 0, got -2"),
    ({"name": "tenant_share", "params": {"slack": -0.5}}, "slack must be >= 0, got -0.5"),
], ids=["max_waiting", "max_inflight", "max_inflight-type", "max_sessions", "slack"])
def test_an_impossible_policy_value_is_refused_by_sim_and_serve(tmp_path, params, needle):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"policies": {"ingress": params}}))
    assert_one_error_line(coda("sim", "-w", SMALL, "-c", str(cfg)), 2, needle)
    cfg.write_text(json.dumps({"backends": ["http://127.0.0.1:9"], "policies": {"ingress": params}}))
    assert_one_error_line(coda("serve", "-c", str(cfg)), 2, needle)


@pytest.mark.parametrize(("kind", "spec", "line"), [
    ("state", {"name": "tiered_aging", "params": {"tau_s": -1}}, "state admission policy tiered_aging: tau_s must be > 0, got -1"),
    ("state", {"name": "tiered_aging", "params": {"w_max_s": "soon"}},
     "state admission policy tiered_aging: parameter w_max_s='soon' must be a number"),
    ("eviction", {"name": "tool_aware", "params": {"min_samples": 0}}, "eviction policy tool_aware: min_samples must be >= 1, got 0"),
    ("ingress", {"name": "session", "params": {"kv_high": 2}}, "ingress policy session: kv_high must be within [0, 1], got 2"),
], ids=["tau_s", "w_max_s-type", "min_samples", "kv_high"])
def test_a_bad_policy_block_fails_with_the_same_line_at_load_in_every_shell(tmp_path, kind, spec, line):
    """The policy parameters are checked when each shell's configuration loads, including the
    kinds a shell does not enforce (the gateway runs no state policy, vLLM no ingress policy)."""
    from coda.errors import CodaError
    from coda.integrations.vllm.settings import CONFIG_ENV, load_settings

    block = {"policies": {kind: spec}}
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(block))
    assert_one_error_line(coda("sim", "-w", SMALL, "-c", str(cfg)), 2, f"{cfg}: {line}")
    cfg.write_text(json.dumps({"backends": ["http://127.0.0.1:9"], **block}))
    assert_one_error_line(coda("serve", "-c", str(cfg)), 2, f"{cfg}: {line}")
    with pytest.raises(CodaError) as err:
        load_settings({CONFIG_ENV: json.dumps(block)})
    assert str(err.value) == f"{CONFIG_ENV}: {line}"


def test_bench_refuses_a_model_the_endpoint_does_not_serve_before_replaying(tmp_path):
    with FakeEngineProcess("--speedup", "20") as engine:
        proc = coda("bench", "--endpoint", engine.url, "--workload", SMALL, "--model", "nosuch", "--out", str(tmp_path / "out"))
    assert_one_error_line(proc, 2, "--model 'nosuch'", "coda-fake")
    assert not any((tmp_path / "out").iterdir())


def test_version():
    proc = coda("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"coda {__version__}"


def test_bench_fails_before_starting_when_the_endpoint_does_not_answer(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = coda("bench", "--endpoint", dead, "--workload", SMALL, "--out", str(tmp_path / "out"))
    assert_one_error_line(proc, 2, f"--endpoint {dead} does not answer", "start the server or fix the URL")
    assert not any((tmp_path / "out").iterdir())  # failed before replaying anything (--out is only made, to check it)


def test_bench_exits_non_zero_when_no_request_completed(tmp_path):
    with FakeEngineProcess("--speedup", "20", "--max-model-len", "16") as engine:  # every prompt is too long: 400s
        proc = coda("bench", "--endpoint", engine.url, "--workload", SMALL, "--time-scale", "0.05", "--drain-s", "5",
                    "--out", str(tmp_path), "--json")
    assert_one_error_line(proc, 1, "no request completed", str(tmp_path))
    summary = json.loads(proc.stdout)  # what was measured is still reported and written
    assert summary["offered"] > 0 and summary["completed"] == 0
    assert all(json.loads(line)["state"] != "completed" for line in (tmp_path / "requests.jsonl").read_text().splitlines())


def test_a_huge_profile_file_is_refused_in_one_line_before_it_is_read(tmp_path):
    huge = tmp_path / "huge.json"
    with huge.open("wb") as fh:  # sparse: 65 MiB long, nothing written
        fh.truncate(65 * 2**20)
    assert_one_error_line(coda("sim", "-w", SMALL, "--profile", str(huge)), 2, f"profile {huge}", "more than any profile")
