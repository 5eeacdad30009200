"""The command line never hangs or prints a traceback: every top-level config option of every
command that reads a config, given a value of any type, is either taken or refused in one line;
a YAML alias bomb is refused before it is built; an unreachable ``--ray`` address is one line and
exit 2; every output path is checked before the work starts."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.bench.replay import BenchConfig
from coda.cli import bench, fake_engine, sim
from coda.engines.fake import FakeEngineConfig
from coda.errors import CodaError
from coda.gateway.config import GatewayConfig, build_config
from coda.sim.config import SimConfig
from tests.property.test_cli_files import assert_refused_in_one_line
from tests.property.test_cli_files import run as run_in_process
from tests.waiting import HANG_GUARD_S

SPEC = "synth:rate=0.5,duration=4,seed=0"
DEAD = "http://127.0.0.1:9"
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=3),
    st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.text(max_size=4)), max_size=2),
)


def _sim(path: Path) -> Any:
    return sim._settings(path, {})


def _bench(path: Path) -> Any:
    return bench._config(path, {"slo_ttft_s": None, "slo_tbt_s": None})


def _serve(path: Path) -> Any:
    return build_config({"backends": [DEAD], **yaml.safe_load(path.read_text())}, {}, environ={}, source=str(path))


def _fake(path: Path) -> Any:
    return fake_engine.build_config(path, {})


LOADERS = {
    "sim": (_sim, [*SimConfig.model_fields, *sim.CONFIG_ONLY_KEYS]),
    "bench": (_bench, [*BenchConfig.model_fields, *bench.CONFIG_ONLY, "slo"]),
    "serve": (_serve, list(GatewayConfig.model_fields)),
    "fake-engine": (_fake, [*FakeEngineConfig.model_fields, *fake_engine.WORKER_KEYS]),
}


def run(*args: str, timeout_s: float = HANG_GUARD_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coda.cli", *args], capture_output=True, text=True, timeout=timeout_s)


def one_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert all(w in lines[0] for w in words), lines[0]


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_config_option_of_any_type_is_taken_or_refused_in_one_line(tmp_path, data):
    command = data.draw(st.sampled_from(sorted(LOADERS)))
    load, keys = LOADERS[command]
    key = data.draw(st.sampled_from(keys))
    value = data.draw(VALUES)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({key: value, **({"endpoint": DEAD} if command == "bench" and key != "endpoint" else {})}))
    try:
        load(path)
    except CodaError as err:
        assert "\n" not in str(err) and str(err)


#: options of sim and compare, each given a value drawn from what a careless user types
OPTIONS = {
    "sim": ["--workers", "--seed", "--warmup-s", "--drain-s", "--slo-ttft-s", "--slo-tbt-s", "--format", "--profile", "--system",
            "--ingress", "--router", "--state"],
    "compare": ["--seeds", "--baseline", "--systems", "--jobs"],
}
TYPED = ["-1", "0", "2", "x", "nan", "inf", "-inf", "1e309", "", " ", "1,2", "-5.5", "1e-300", "vllm", "coda+x"]


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(command=st.sampled_from(sorted(OPTIONS)), data=st.data())
def test_an_option_of_any_value_is_taken_or_refused_in_one_line(command, data):
    option = data.draw(st.sampled_from(OPTIONS[command]))
    value = data.draw(st.sampled_from(TYPED))
    # compare runs its one cell in this process unless the option drawn is --jobs (no fork of the test runner)
    fixed = {"--systems": "vllm", "--jobs": "1"} if command == "compare" else {}
    args = [command, "-w", SPEC, *(x for k, v in fixed.items() if k != option for x in (k, v)), option, value]
    code, err = run_in_process(args)
    assert_refused_in_one_line(code, err, args)


def test_an_infinite_hbm_is_refused_in_one_line():
    one_line(run("sim", "-w", SPEC, "--hbm-kv-gib", "inf"), "hbm_kv_gib")


def test_an_absurd_seed_count_is_refused_in_one_line_not_run():
    one_line(run("compare", "-w", SPEC, "--systems", "vllm", "--seeds", "99999999999999999999"), "--seeds", "10,000")


@pytest.mark.parametrize("value", [["a.jsonl", "b.jsonl"], 5, {"spec": SPEC}])
@pytest.mark.parametrize("command", [["sim"], ["compare", "--systems", "vllm"], ["profile", "roofline"],
                                     ["bench", "-e", DEAD, "--out", "{DIR}/b"]])
def test_a_workload_option_of_the_wrong_type_is_one_line(tmp_path, command, value):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"workload": value}))
    one_line(run(*[a.format(DIR=tmp_path) for a in command], "-c" if command[0] != "profile" else "--config", str(path)),
             str(path), "workload")


def test_a_yaml_alias_bomb_is_refused_before_it_is_built(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]  # 9**9 values
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    one_line(run("sim", "-w", SPEC, "-c", str(path)), str(path), "aliases")
    path.write_text("policies: &p {ingress: *p}\n")  # an alias inside its own anchor
    one_line(run("sim", "-w", SPEC, "-c", str(path)), str(path), "alias")


def test_an_oversized_config_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (5 * 2**20) + "\nworkers: 1\n")
    one_line(run("sim", "-w", SPEC, "-c", str(path)), str(path), "bytes")


def test_an_unreachable_ray_address_is_one_line_and_exit_2():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    one_line(run("compare", "-w", SPEC, "--systems", "vllm", "--ray", f"127.0.0.1:{port}"), f"127.0.0.1:{port}", "--ray")


def test_output_paths_are_checked_before_the_work(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    bad = str(blocker / "out.json")
    # the engine is not reachable: the output path is named first, before any probe of it
    one_line(run("profile", "measure", "--endpoint", DEAD, "--out", bad), "--out", bad)
    one_line(run("serve", "--backend", DEAD, "--decision-log", bad), "decision_log", bad)
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump({"backends": [DEAD], "access_log": {"path": bad}}))
    one_line(run("serve", "--config", str(cfg)), "access_log.path", bad)
