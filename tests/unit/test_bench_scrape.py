"""Reading vLLM's /metrics: gauges summed over label sets (ranks, models), the older KV gauge
name, counters as deltas, and the prefix-cache hit rate per interval and over the run."""

from __future__ import annotations

import pytest

from coda.bench.scrape import EngineSeries, parse
from coda.metrics.requests import Window


def exposition(waiting: tuple[int, int], queries: float, hits: float, kv_name: str = "vllm:kv_cache_usage_perc") -> str:
    """A vLLM exposition with two data-parallel ranks (engine="0" and "1")."""
    lines = ["# HELP vllm:num_requests_waiting Requests waiting", "# TYPE vllm:num_requests_waiting gauge"]
    lines += [f'vllm:num_requests_waiting{{engine="{i}",model_name="m"}} {w}' for i, w in enumerate(waiting)]
    lines += [f"# TYPE {kv_name} gauge", f'{kv_name}{{engine="0",model_name="m"}} 0.25']
    lines += ["# TYPE vllm:prefix_cache_queries counter", f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}',
              'vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9']
    lines += ["# TYPE vllm:prefix_cache_hits counter", f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}']
    lines += ["# TYPE vllm:time_to_first_token_seconds histogram", 'vllm:time_to_first_token_seconds_bucket{le="0.1"} 3']
    return "\n".join(lines) + "\n"


def test_gauges_are_summed_over_label_sets_and_unwanted_samples_are_dropped():
    sums = parse(exposition((2, 3), 100.0, 40.0))
    assert sums == {"vllm:num_requests_waiting": 5.0, "vllm:kv_cache_usage_perc": 0.25, "vllm:prefix_cache_queries_total": 100.0,
                    "vllm:prefix_cache_hits_total": 40.0}


def test_series_read_the_older_kv_name_and_hit_rates_are_deltas():
    eng = EngineSeries("http://e")
    for t, (q, h) in enumerate([(0, 0), (100, 50), (100, 50), (300, 200)]):
        eng.add(float(t), parse(exposition((1, 0), q, h, kv_name="vllm:gpu_cache_usage_perc")))
    s = eng.series()
    assert s["kv_usage"] == [0.25] * 4 and s["waiting"] == [1.0] * 4 and s["running"] == [None] * 4
    assert s["prefix_hit_rate"] == [None, 0.5, None, 0.75]  # nothing queried in the third interval
    summary = eng.summary(Window(1.0, 2.0))
    assert summary["prefix_queries_delta"] == 300 and summary["prefix_hit_rate"] == pytest.approx(200 / 300)  # the whole run
    assert summary["waiting_mean"] == 1.0 and summary["samples"] == 4 and summary["running_mean"] is None
