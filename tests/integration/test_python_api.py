"""The Python API example of docs/cli.md runs as written, and `coda.simulate` gives what `coda sim --json`
prints for the same configuration."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import coda
from coda.sim.run import SUMMARY_METRICS

ROOT = Path(__file__).resolve().parents[2]


def docs_example() -> str:
    section = (ROOT / "docs" / "cli.md").read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_the_documented_example_runs(capsys):
    namespace: dict = {}
    exec(compile(docs_example(), "docs/cli.md", "exec"), namespace)
    printed = capsys.readouterr().out.split()
    assert len(printed) == 4 and int(printed[2]) == len(namespace["result"].records) > 0
    table = namespace["table"]
    assert [r["system"] for r in table["rows"]] == ["vllm", "coda"] and table["seeds"] == [0, 1]
    assert float(printed[3]) == table["ratios_vs_baseline"]["coda"]["output_tps"] > 0


def test_simulate_gives_what_the_command_line_prints():
    spec = "synth:rate=1,duration=300,seed=3"
    api = coda.simulate(spec, coda.SimConfig(system="coda", workers=2)).summary()
    cli = subprocess.run([sys.executable, "-m", "coda.cli", "sim", "--workload", spec, "--system", "coda", "--workers", "2", "--json"],
                         capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(cli.stdout)
    assert {k: got[k] for k in SUMMARY_METRICS} == {k: api[k] for k in SUMMARY_METRICS}
    assert got["config"] == api["config"]
