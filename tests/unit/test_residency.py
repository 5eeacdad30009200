"""Residency from per-request records: a log's paths equal the simulator's own, comparisons join
by session and round, and a malformed log is one line naming the file, line and field."""

from __future__ import annotations

import json

import pytest

from coda.errors import CodaError
from coda.eval.residency import RequestRecord, compare, path_shares, read_engine_log, record_from, resumed
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload


def _log(tmp_path, rows):
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_paths_read_from_the_records_are_the_simulators_own():
    """The definition of the log reader (previous context or the stated reusable prefix, whole
    blocks, at most the prompt less one token) gives every resumed request the path the simulator
    decided at its admission, tiers included."""
    wl = load_workload("synth:rate=20,duration=60,seed=3,tokens=0.03,tools=0.1")
    sim = Simulation(wl, SimConfig(system="vllm", profile="vllm-cpu-tiny", workers=2, chunk_tokens=32, num_gpu_blocks=250, dram=False,
                                   warmup_s=0))
    result = sim.run()
    done = [r for r in result.records if r["state"] == "completed"]
    got = {(x.record.session, x.record.round): x.path for x in resumed(map(record_from, done), 32)}
    want = {(r["session_id"], r["round"]): r["path"] for r in done if r["round"] > 0}
    assert got == want
    assert {"hbm", "recompute"} <= set(got.values())  # sessions move between workers (round robin) and evict each other


def test_an_engine_log_without_reusable_counts_takes_the_previous_context(tmp_path):
    rows = [
        {"session_id": "a", "round": 0, "prompt_tokens": 100, "output_tokens": 20, "cached_tokens": 0},
        {
            "session_id": "a",
            "round": 1,
            "prompt_tokens": 150,
            "output_tokens": 5,
            "cached_tokens": 112,
        },  # 120 reusable: 7 blocks of 16 = 112
        {"session_id": "a", "round": 2, "prompt_tokens": 160, "output_tokens": 5, "cached_tokens": 96},  # 155 -> 144 reusable: 96 found
        {"session_id": "b", "round": 1, "prompt_tokens": 50, "output_tokens": 5, "cached_tokens": 32},  # round 0 missing: not counted
        {"session_id": "c", "round": 0, "prompt_tokens": 10, "output_tokens": 1, "cached_tokens": 0, "state": "failed"},
        # a log with tiers (as the simulator writes it): the lowest tier that held part of the prefix names the path
        {
            "session_id": "d",
            "round": 3,
            "prompt_tokens": 100,
            "output_tokens": 1,
            "hbm_hit_tokens": 32,
            "dram_hit_tokens": 32,
            "reusable_tokens": 64,
        },
        {
            "session_id": "d",
            "round": 4,
            "prompt_tokens": 100,
            "output_tokens": 1,
            "hbm_hit_tokens": 16,
            "dram_hit_tokens": 16,
            "ssd_hit_tokens": 32,
            "reusable_tokens": 64,
        },
    ]
    records = read_engine_log(_log(tmp_path, rows))
    assert len(records) == 6
    shares = path_shares(records, 16)
    assert shares["counts"] == {"hbm": 1, "dram": 1, "ssd": 1, "recompute": 1}
    assert shares["tokens"] == {"hbm": 256.0, "dram": 48.0, "ssd": 32.0, "not_resident": 48.0}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{oops", "log.jsonl:2: json: not valid JSON"),
        ("[1, 2]", "log.jsonl:2: row: not a JSON object"),
        (json.dumps({"session_id": "a", "round": 1, "prompt_tokens": 10, "output_tokens": 2}), "log.jsonl:2: row: no cached_tokens field"),
        (
            json.dumps({"session_id": "a", "round": 1, "prompt_tokens": "10", "output_tokens": 2, "cached_tokens": 0}),
            "log.jsonl:2: prompt_tokens: '10' is not a token count",
        ),
        (
            json.dumps({"session_id": "a", "round": 1, "prompt_tokens": 10, "output_tokens": 2, "cached_tokens": 11}),
            "log.jsonl:2: cached_tokens: 11 cached tokens exceed the 10-token prompt",
        ),
    ],
)
def test_a_malformed_line_is_one_error_naming_it(tmp_path, line, message):
    path = tmp_path / "log.jsonl"
    path.write_text(
        json.dumps({"session_id": "a", "round": 0, "prompt_tokens": 10, "output_tokens": 2, "cached_tokens": 0}) + "\n" + line + "\n"
    )
    with pytest.raises(CodaError, match=message) as err:
        read_engine_log(path)
    assert "\n" not in str(err.value)


def test_a_log_of_nothing_completed_or_missing_says_so(tmp_path):
    with pytest.raises(CodaError, match="no completed requests"):
        read_engine_log(_log(tmp_path, [{"state": "failed"}]))
    with pytest.raises(CodaError, match="no such file"):
        read_engine_log(tmp_path / "absent.jsonl")


def test_compare_joins_by_session_and_round_and_judges_within_the_tolerance():
    def rec(session, k, prompt, cached, reusable=None):
        return RequestRecord(session, k, prompt, 10, cached, reusable=reusable)

    sim = [rec("a", 0, 100, 0, 0), rec("a", 1, 200, 96, 110), rec("a", 2, 300, 192, 210), rec("b", 1, 100, 0, 50)]
    real = [rec("a", 0, 100, 0), rec("a", 1, 200, 96), rec("a", 2, 300, 160), rec("x", 0, 100, 0)]
    out = compare(real, sim, 32, tolerance=0.05)
    assert (out["requests"], out["real_only"], out["sim_only"]) == (3, 1, 1)
    assert out["agreement_share"] == pytest.approx(2 / 3)  # a/2 differs by 32 tokens, more than 5% of 300
    # the real records take the workload's reusable prefix from the simulation: 96 of 96 and 160 of 192 found
    assert out["resumed"] == 2 and out["hbm_ready_real"] == pytest.approx(0.5) and out["hbm_ready_sim"] == pytest.approx(1.0)
    assert out["sim_more"] == 1 and out["real_more"] == 0
    with pytest.raises(CodaError, match="no request completed in both"):
        compare([rec("x", 0, 100, 0)], sim, 32)
