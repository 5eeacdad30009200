"""Ingress admission through `coda serve` in front of two slow `coda fake-engine` workers (one
running request each, so queues build): 529 overload with a Retry-After the openai client
honours, 503 after a bounded deferral, 429 for the tenant over its share while another is served."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.serving.procs import Proc, running
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
ADMIN = "admin"


@pytest.fixture(scope="module")
def engines():
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FakeEngineProcess("--speedup", "4", "--max-num-seqs", "1", "--max-model-len", "8192")) for _ in range(2)]


@contextlib.contextmanager
def gateway(tmp: Path, engines, **cfg) -> Iterator[Proc]:
    path = tmp / "coda.yaml"
    # least_loaded spreads the queued requests one per worker (coda would group them by context length)
    base = {
        "backends": [e.url for e in engines],
        "telemetry": {"scrape_interval_s": 0.05},
        "auth": {"admin_key": ADMIN, **cfg.pop("auth", {})},
        "decision_log": str(tmp / "decisions.jsonl"),
        "policies": {"router": "least_loaded", "ingress": cfg.pop("ingress")},
    }
    path.write_text(yaml.safe_dump({**base, **cfg}))
    with running("serve", "--config", str(path), "--port", "0") as gw:
        yield gw


def client(url: str, key: str = "k", retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=retries, timeout=30)


def hold(c: openai.OpenAI, tag: str, max_tokens: int = 3000):
    """A long streaming request, started and held open (first token received)."""
    s = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"long task {tag}"}], max_tokens=max_tokens, stream=True
    )
    next(iter(s))
    return s


def background(c: openai.OpenAI, content: str, max_tokens: int) -> threading.Thread:
    """A request sent from a thread: the gateway answers only once the engine produces its first
    byte, which for a queued request is after the requests ahead of it."""
    t = threading.Thread(
        target=lambda: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens),
        daemon=True,
    )
    t.start()
    return t


def metric(url: str, line_start: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def queue_depths(gw: Proc) -> list[int]:
    """Each engine's waiting queue as the gateway last scraped it (what its policies decide on)."""
    state = httpx.get(gw.url + "/debug/state", headers={"authorization": f"Bearer {ADMIN}"}).json()
    return [w["queue_depth"] for w in state["workers"]]


def decisions(tmp: Path) -> list[dict]:
    """The gateway's decision log (flushed when it stops)."""
    return [json.loads(line) for line in (tmp / "decisions.jsonl").read_text().splitlines()]


def test_overload_529_with_retry_after_that_the_openai_client_honours(tmp_path, engines):
    rejects = 'coda_ingress_decisions_total{action="reject",policy="overload",reason="overloaded"}'
    with gateway(tmp_path, engines, ingress={"name": "overload", "params": {"max_inflight": 1, "retry_after_s": 2.0}}) as gw:
        c = client(gw.url)
        held = [hold(c, "a"), hold(c, "b")]  # one per worker: every worker at max_inflight until the test closes them
        with pytest.raises(openai.APIStatusError) as exc:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "one more"}], max_tokens=2)
        err = exc.value
        assert err.status_code == 529 and err.response.headers["retry-after"] == "2"
        assert err.body["code"] == "overloaded" and "every worker is at its load limit" in err.body["message"]
        # a retrying client gets its 529 while the workers are held, waits the 2 s it was told, then succeeds
        done: list = []
        retrying = threading.Thread(
            target=lambda: done.append(
                client(gw.url, retries=3).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "one more"}], max_tokens=2
                )
            ),
            daemon=True,
        )
        retrying.start()
        wait_until(lambda: metric(gw.url, rejects) == 2, "the retrying client's first attempt is rejected")
        for s in held:
            s.close()
        retrying.join(120)
        assert done and done[0].choices[0].finish_reason == "length"
        assert metric(gw.url, rejects) == 2
    log = sorted(decisions(tmp_path), key=lambda r: r["rid"])  # an admitted request's record is written when it ends
    assert [r["action"] for r in log] == ["admit", "admit", "reject", "reject", "admit"]  # two held, then "one more" thrice
    # in the gateway's own log: the retry came the 2 s it was told after its 529 (the openai
    # client's own backoff would have retried within a second); a lower bound, which a slow machine only widens
    assert log[4]["ts"] - log[3]["ts"] >= 1.9


def test_defer_holds_then_503_with_retry_after(tmp_path, engines):
    policy = {"name": "queue_limit", "params": {"max_waiting": 1, "retry_after_s": 1.0}, "defer": {"max_wait_s": 0.6}}
    with gateway(tmp_path, engines, ingress=policy) as gw:
        c = client(gw.url)
        held = [hold(c, str(i)) for i in range(2)]
        waiting = [background(c, f"queued {i}", 5) for i in range(2)]  # each engine runs one and queues one
        wait_until(lambda: min(queue_depths(gw)) >= 1, lambda: f"queues as the gateway sees them: {queue_depths(gw)}")
        with pytest.raises(openai.APIStatusError) as exc:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "deferred"}], max_tokens=2)
        assert exc.value.status_code == 503 and exc.value.response.headers["retry-after"] == "1"
        assert exc.value.body["code"] == "queue_full"
        for s in held:
            s.close()
        for t in waiting:
            t.join(60)
        # once the queues drain, the same request is admitted
        wait_until(lambda: max(queue_depths(gw)) == 0, lambda: f"queues as the gateway sees them: {queue_depths(gw)}")
        assert c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "deferred"}], max_tokens=2).choices
        assert metric(gw.url, "coda_ingress_deferred_total") >= 1
    shed = [r for r in decisions(tmp_path) if r["action"] != "admit"]
    # held in the gateway for its max_wait_s, then answered 503 (a lower bound, which a slow machine only widens)
    assert len(shed) == 1 and shed[0]["deferred"] and shed[0]["reason"] == "queue_full" and shed[0]["waited_s"] >= 0.6


def test_tenant_over_its_share_gets_429_while_another_tenant_is_served(tmp_path, engines):
    # kv_high 0 presses the dual gate's KV side always (the fake engines' caches stay nearly empty), so the queues decide
    cfg = {
        "auth": {"api_keys": {"key-a": "a", "key-b": "b"}},
        "tenants": {"a": {"weight": 1}, "b": {"weight": 1}},
        "ingress": {"name": "tenant_share", "params": {"queue_high": 1, "slack": 0.0, "kv_high": 0.0}},
    }
    with gateway(tmp_path, engines, **cfg) as gw:
        a, b = client(gw.url, "key-a"), client(gw.url, "key-b")
        held = [hold(b, "b0"), hold(a, "a0")]
        queued = [background(a, f"long task a{i}", 5) for i in (1, 2)]
        wait_until(lambda: min(queue_depths(gw)) >= 1, lambda: f"queues as the gateway sees them: {queue_depths(gw)}")
        with pytest.raises(openai.RateLimitError) as exc:
            a.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long task a3"}], max_tokens=2)
        assert exc.value.body["code"] == "tenant_over_share" and exc.value.response.headers["retry-after"]
        served = b.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long task b1"}], max_tokens=2)
        assert served.choices[0].finish_reason == "length"
        for s in held:
            s.close()
        for t in queued:
            t.join(60)


def test_the_gateway_reports_how_late_its_event_loop_runs(tmp_path, engines):
    """The loop-lag histogram counts every housekeeping wake: the gauge of the gateway's own CPU
    saturation, which makes every scrape (and so telemetry.stale_after_s) late alike."""
    with gateway(tmp_path, engines, ingress={"name": "admit_all"}) as gw:
        wait_until(lambda: metric(gw.url, "coda_gateway_event_loop_lag_seconds_count") >= 2, "two housekeeping wakes observed")
        total = metric(gw.url, "coda_gateway_event_loop_lag_seconds_count")
        within = metric(gw.url, 'coda_gateway_event_loop_lag_seconds_bucket{le="+Inf"}')
        assert within >= total >= 2
