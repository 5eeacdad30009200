"""The liveness verdict: per gate, how often it fired, on which signal, and the share of requests
it touched; a gate that never fired is named in one line. Counted alike by the simulator and the
gateway (whose /metrics counters ``coda bench`` reads back)."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families

from coda.gateway.admission import Admission, JsonlLog
from coda.gateway.config import build_config
from coda.gateway.prometheus import GatewayMetrics
from coda.gateway.prompt import CharTokenizer
from coda.gateway.view import GatewayState, Ticket
from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.serving.errors import ApiError
from coda.shell.build import make_policy
from coda.shell.liveness import Liveness, from_metrics, gate_decisions, summary_line, verdict
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.schema import Round, Session, Workload


def snap(**w) -> IngressSnapshot:
    return IngressSnapshot(now_s=0.0, tenant="t", prompt_tokens=100, workers=(WorkerLoad(0, **w),), session_id="new")


def test_each_gate_of_a_composition_is_counted_on_its_own_signal():
    p = make_policy("ingress", "queue_limit+session+overload")
    live = Liveness.of(p)
    stalled = snap(inflight_requests=3, inflight_tokens=900, new_tokens=200, kv_capacity_tokens=1000, max_num_seqs=16)
    live.observe(1, gate_decisions(p, stalled))  # only queue_limit fires: the request does not fit beside what is in flight
    live.observe(1, gate_decisions(p, stalled))  # held and decided again: fires twice, touches once
    live.done(1)
    live.observe(2, gate_decisions(p, snap()))
    live.done(2)
    r = live.report()
    assert r["requests"] == 2
    assert r["gates"]["queue_limit"] | {} == {
        "fired": 2,
        "by_action": {"defer": 2},
        "by_signal": {"inflight_tokens": 2},
        "requests_touched": 1,
        "touched_share": 0.5,
    }
    assert r["gates"]["session"]["fired"] == 0 and r["gates"]["overload"]["fired"] == 0
    assert verdict(r) == [
        "ingress gate session never fired over 2 requests: it behaved as admit_all",
        "ingress gate overload never fired over 2 requests: it behaved as admit_all",
    ]
    assert summary_line(r).startswith("queue_limit fired 2x (inflight_tokens 2; 50.0% of 2 requests); session never fired")
    # the dual gate names both pressures
    d = make_policy("ingress", "session").decide(snap(kv_usage=0.9, queue_depth=3))
    assert (d.action, d.signal) == ("defer", "kv_usage+queue_depth")


def agents(n: int, spread_s: float) -> Workload:
    return Workload(
        sessions=[
            Session(
                session_id=f"s{i}",
                start_s=i * spread_s / n,
                rounds=[
                    Round(new_input_tokens=600, output_tokens=40, kind="tool_followup" if k else "user", tool_duration_s=0.5)
                    for k in range(3)
                ],
            )
            for i in range(n)
        ],
        meta={"duration_s": 1e5},
    )


def test_a_simulation_reports_whether_its_policy_fired():
    wl = agents(4, spread_s=400.0)  # one session at a time
    quiet = Simulation(wl, SimConfig(workers=2, warmup_s=0, policies={"ingress": "session"})).run().summary()["ingress"]
    assert quiet["liveness"]["requests"] == wl.num_requests
    assert quiet["verdict"] == [f"ingress gate session never fired over {wl.num_requests} requests: it behaved as admit_all"]
    busy = Simulation(
        agents(12, spread_s=1.0),
        SimConfig(workers=1, max_num_seqs=2, warmup_s=0, policies={"ingress": {"name": "queue_limit", "params": {"max_waiting": 1}}}),
    )
    live = busy.run().summary()["ingress"]
    g = live["liveness"]["gates"]["queue_limit"]
    assert g["fired"] > 0 and all(set(sig.split("+")) <= {"queue_depth", "inflight_requests", "inflight_tokens"} for sig in g["by_signal"])
    assert 0 < g["touched_share"] <= 1 and live["verdict"] == []


def test_the_gateway_counts_gates_in_metrics_and_the_decision_log(tmp_path):
    cfg = build_config(
        {
            "backends": [{"url": "http://a:1", "max_num_seqs": 1}],
            "policies": {"ingress": {"name": "queue_limit+overload", "defer": {"max_wait_s": 0}}},
        },
        {},
        {},
    )
    s = GatewayState(cfg, CharTokenizer(), lambda: 0.0)
    w = s.workers[0]
    w.models, w.scraped_at = {"m": {"id": "m"}}, 0.0
    metrics = GatewayMetrics()
    log = tmp_path / "decisions.jsonl"
    adm = Admission(s, metrics, JsonlLog(str(log)))
    before = from_metrics(samples(metrics, s))
    assert before["requests"] == 0 and set(before["gates"]) == {"queue_limit", "overload"}  # both series exist before any fire

    def ticket() -> Ticket:
        return Ticket(s.next_rid(), "/v1/completions", "t", None, "m", 100, 16, [], s.workers, {})

    async def run() -> None:
        first = ticket()
        await adm.admit(first)
        s.begin(first, w)  # the one seat is taken
        for _ in range(3):
            try:
                await adm.admit(ticket())
            except ApiError as err:
                assert err.status == 529  # overload rejects; queue_limit would have deferred

    asyncio.run(run())
    adm.log.close()
    r = from_metrics(samples(metrics, s), before)
    assert r == adm.liveness.report()  # the counters say what the gateway counted
    assert r["requests"] == 4 and r["gates"]["queue_limit"]["by_signal"] == {"inflight_requests": 3}
    assert r["gates"]["overload"]["by_action"] == {"reject": 3} and r["gates"]["overload"]["touched_share"] == 0.75
    rec = json.loads(log.read_text().splitlines()[-1])
    assert rec["gates"] == {
        "queue_limit": {"action": "defer", "reason": "queue_full", "signal": "inflight_requests"},
        "overload": {"action": "reject", "reason": "overloaded", "signal": "inflight_requests"},
    }


def samples(metrics: GatewayMetrics, s: GatewayState) -> list:
    text = metrics.render(s, {}).decode()
    return [(x.name, dict(x.labels), float(x.value)) for f in text_string_to_metric_families(text) for x in f.samples]
