"""The gateway configs the project ships (the example, the benchmarks' settings) load as they are
documented, so a field renamed in the schema cannot leave them behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from coda.config.load import read_config
from coda.gateway.config import build_config
from coda.gateway.prompt import CharTokenizer
from coda.gateway.view import GatewayState

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_config_loads():
    cfg = build_config(read_config(ROOT / "examples" / "coda.yaml"), {}, {})
    assert [b.name for b in cfg.backends] == ["gpu0", "gpu1"]
    assert cfg.policy_spec.ingress.name == "session+tenant_share+overload"


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_each_benchmark_config_builds_its_policies(path):
    """The benchmarks give their engines as backends; the file gives the rest."""
    raw = read_config(path)
    state = GatewayState(build_config({**raw, "backends": ["http://a:1"]}, {}, {}), CharTokenizer())
    params = raw["policies"]["ingress"].get("params", {})
    assert all(getattr(state.ingress, k) == v for k, v in params.items())
