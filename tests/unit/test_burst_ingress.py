"""The agent burst's doors are configured as their users would: a door that admits by a predicted
TTFT is told the run's SLO (a door left at its 5-s default would judge a 2-s run by the wrong
bound), any other is named alone, and what the burst hands `coda serve` builds that policy."""

from __future__ import annotations

from coda.bench.burst import CONFIGS, ingress_of
from coda.gateway.config import GatewayConfig
from coda.shell.build import build_policies


def built(spec: object):
    cfg = GatewayConfig.model_validate({"backends": [{"url": "http://127.0.0.1:1"}], "policies": {"ingress": spec}})
    return build_policies(cfg.policy_spec, kinds=("ingress",)).ingress


def test_the_predicted_wait_door_is_told_the_runs_slo():
    spec = ingress_of(CONFIGS["coda-gateway+predicted_wait"], 2.0)
    assert spec == {"name": "predicted_wait", "params": {"ttft_slo_s": 2.0}}
    door = built(spec)
    assert (door.name, door.ttft_slo_s) == ("predicted_wait", 2.0)


def test_other_doors_are_named_alone_and_build():
    assert ingress_of(CONFIGS["coda-gateway"], 2.0) is None
    for name in ("coda-gateway+queue_limit", "coda-gateway+session"):
        spec = ingress_of(CONFIGS[name], 2.0)
        assert spec == CONFIGS[name].ingress and built(spec).name == spec
