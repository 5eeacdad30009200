"""Trace loaders: the shared public traces load with the right numbers; bad rows fail on their line;
dropped rows are accounted for, and nothing else is lost or duplicated."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.errors import CodaError
from coda.workload.schema import session_prompts
from coda.workload.spec import detect_format, load_workload
from coda.workload.stats import workload_stats
from coda.workload.subsample import subsample
from tests.conftest import shared_path

TRACELAB = "tracelab_example_sanitized_round_trace.jsonl"
MOONCAKE = "conversation_trace.jsonl"
AZURE = "AzureLLMInferenceTrace_code.csv"


# --- the shared traces --------------------------------------------------------------------
def test_tracelab_sample_sessions_tokens_and_tools():
    path = shared_path("traces", TRACELAB)
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    wl = load_workload(str(path))
    assert wl.meta["source"] == "tracelab" and wl.meta["load"]["kept_rows"] == 19
    assert len(wl.sessions) == 2 and wl.num_requests == 19
    by_id = {s.session_id: s for s in wl.sessions}
    for sid, sess in by_id.items():
        rows = sorted((r for r in raw if r["session_id"] == sid), key=lambda r: r["round_index"])
        prompts = [p for _, p in session_prompts(sess)]
        assert prompts == [r["input_tokens_total"] for r in rows]
        assert [rnd.output_tokens for rnd in sess.rounds] == [r["output_tokens"] for r in rows]
        assert [[(t.name, t.duration_s) for t in rnd.tools] for rnd in sess.rounds] == [
            [(t["tool_name"], t["tool_wall_latency_ms"] / 1000) for t in r["tools"]] for r in rows
        ]
    claude = next(s for s in wl.sessions if s.session_id.startswith("claude"))
    assert len(claude.rounds) == 10 and claude.prefix_group == "claude"
    assert claude.rounds[0].prefix_tokens == 27217 and claude.rounds[0].tool_duration_s == pytest.approx(19.291)
    assert [r.kind for r in claude.rounds].count("user") == 2
    # user think time = TraceLab's human input wait minus the previous round's tool time
    thinks = sorted(round(r.think_time_s, 3) for s in wl.sessions for r in s.rounds if r.think_time_s)
    assert thinks == [6.342, 18.365, 19.913]
    assert workload_stats(wl)["request_rate"] == pytest.approx(7.0)  # starts re-paced to the replay rate


def test_tracelab_reads_gzip(tmp_path):
    src = shared_path("traces", TRACELAB)
    gz = tmp_path / "corpus.jsonl.gz"
    with src.open("rb") as fi, gzip.open(gz, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    assert detect_format(gz) == "tracelab"
    assert load_workload(str(gz)).sessions == load_workload(str(src)).sessions


def test_mooncake_conversation_sessions_and_block_reuse():
    path = shared_path("traces", MOONCAKE)
    wl = load_workload(str(path))
    assert wl.num_requests == 12_031 and wl.block_tokens == 512
    assert wl.meta["block_reuse_infinite_cache"] == pytest.approx(0.3664, abs=5e-4)
    multi = [s for s in wl.sessions if len(s.rounds) > 1]
    assert len(multi) == wl.meta["multi_turn_sessions"] == 2023 and len(wl.sessions) == 8108
    assert max(len(s.rounds) for s in wl.sessions) == 43
    for s in multi:
        for prev, cur in zip(s.rounds, s.rounds[1:]):
            k = cur.prefix_tokens // 512
            assert k >= 1 and cur.block_hashes[:k] == prev.block_hashes[:k]  # a continuation re-sends its prefix blocks
            assert cur.at_s >= prev.at_s
    wl.validate_blocks("mooncake")
    assert workload_stats(wl)["prompt_tokens_mean"] == pytest.approx(12_035, abs=1)  # the Mooncake release's average input: 12,035 tokens


def test_azure_code_requests():
    path = shared_path("traces", AZURE)
    wl = load_workload(str(path))
    assert wl.num_requests == len(wl.sessions) == 8_819
    assert min(s.start_s for s in wl.sessions) == 0.0
    assert wl.meta["duration_s"] == pytest.approx(3435.95, abs=0.01)  # 18:17:03.98 to 19:14:19.93
    assert all(r.prefix_tokens is None and r.block_hashes is None for s in wl.sessions for r in s.rounds)


@pytest.mark.parametrize("name, fmt", [(TRACELAB, "tracelab"), (MOONCAKE, "mooncake"), (AZURE, "azure")])
def test_formats_are_detected(name, fmt):
    assert detect_format(shared_path("traces", name)) == fmt


def test_mooncake_subsample_keeps_whole_sessions_at_the_target_rate():
    wl = load_workload(str(shared_path("traces", MOONCAKE)))
    sub = subsample(wl, rate=3.0, seed=0)
    assert workload_stats(sub)["request_rate"] == pytest.approx(3.0, rel=0.01)
    original = {s.session_id: s for s in wl.sessions}
    assert all(original[s.session_id] == s for s in sub.sessions)


# --- building rows ------------------------------------------------------------------------
def _tl_row(sid, idx, prefix=100, append=50, out=20, events=(), tools=(), **extra):
    row = {"session_id": sid, "round_index": idx, "prefix_tokens": prefix, "newly_append_tokens": append, "output_tokens": out,
           "provider": "claude", "timing_events": list(events), "tools": list(tools)}
    row.update(extra)
    return row


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tracelab_rows_are_grouped_ordered_and_dropped_with_reasons(tmp_path):
    rows = [
        _tl_row("b", 1, prefix=100, append=5),
        _tl_row("a", 0, prefix=0, append=300),
        _tl_row("b", 0, prefix=0, append=100),
        _tl_row("a", 1, prefix=900, append=10),  # more than a's previous context of 320: clamped
        _tl_row("a", 1, prefix=300, append=10),  # duplicate round
        _tl_row("a", 2, out=0),  # nothing generated
        _tl_row("c", 0, prefix=None),
        _tl_row("d", 0, tools=[{"tool_name": "Bash", "tool_wall_latency_ms": -5}, {"tool_name": "Read", "tool_wall_latency_ms": 250}]),
    ]
    wl = load_workload(str(_write_jsonl(tmp_path / "t.jsonl", rows)), "tracelab")
    load = wl.meta["load"]
    assert load["rows"] == 8 and load["kept_rows"] == 5
    assert {r: d["rows"] for r, d in load["dropped"].items()} == {
        "duplicate round_index in its session (the first row is kept)": 1,
        "output_tokens is null or 0 (a replayed round generates at least one token)": 1,
        "prefix_tokens or newly_append_tokens is null": 1,
    }
    assert load["dropped"]["prefix_tokens or newly_append_tokens is null"]["first_line"] == 7
    a = next(s for s in wl.sessions if s.session_id == "a")
    assert list(session_prompts(a)) == [(0, 300), (320, 910)]  # clamped prefix, prompt total kept
    assert any("clamped" in r for r in load["adjusted"])
    b = next(s for s in wl.sessions if s.session_id == "b")
    assert [r.new_input_tokens for r in b.rounds] == [100, 5]
    d = next(s for s in wl.sessions if s.session_id == "d")
    assert [(t.name, t.duration_s) for t in d.rounds[0].tools] == [("Read", 0.25)] and d.rounds[0].tool_duration_s == 0.25
    assert load["adjusted"]["tool call with a null or negative tool_wall_latency_ms: left out of the round's tools"] == {
        "rows": 1,
        "first_line": 8,
    }


@pytest.mark.parametrize(
    "fmt, text, where",
    [
        ("tracelab", json.dumps(_tl_row("s", -1)), ":2: round_index: expected `int` >= 0"),
        ("tracelab", json.dumps({"session_id": "s"}), ":2: row: object missing required field `round_index`"),
        ("tracelab", json.dumps(_tl_row("s", 1, events=[{"event_type": "text", "timestamp": "noon"}])), ":2: timing_events[0].timestamp"),
        ("tracelab", "{not json", ":2: json: "),
        ("mooncake", '{"timestamp": 1, "input_length": 600, "output_length": 3, "hash_ids": [1]}', ":2: hash_ids: has 1 ids"),
        ("mooncake", '{"timestamp": 1, "input_length": 6, "output_length": -3, "hash_ids": [1]}', ":2: output_length: expected `int` >= 0"),
    ],
)
def test_bad_json_rows_name_file_line_and_field(tmp_path, fmt, text, where):
    first = (
        json.dumps(_tl_row("ok", 0)) if fmt == "tracelab" else '{"timestamp": 0, "input_length": 6, "output_length": 3, "hash_ids": [1]}'
    )
    path = tmp_path / "bad.jsonl"
    path.write_text(first + "\n" + text + "\n")
    with pytest.raises(CodaError) as err:
        load_workload(str(path), fmt)
    msg = str(err.value)
    assert msg.startswith(f"{path}{where}") and f"read with the {fmt} reader" in msg, msg


@pytest.mark.parametrize(
    "body, where",
    [
        ("2023-11-16 18:17:04,12\n", ":2: row: 2 fields"),
        ("soon,12,3\n", ":2: TIMESTAMP"),
        ("2023-11-16 18:17:04,12,x\n", ":2: ContextTokens/GeneratedTokens"),
        ("2023-11-16 18:17:04,-1,3\n", ":2: ContextTokens/GeneratedTokens: -1, 3"),
    ],
)
def test_bad_azure_rows_name_file_line_and_field(tmp_path, body, where):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    with pytest.raises(CodaError) as err:
        load_workload(str(path), "azure")
    assert str(err.value).startswith(f"{path}{where}"), str(err.value)


def test_a_file_with_nothing_replayable_says_why(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04,0,3\n")
    with pytest.raises(CodaError, match=r"no replayable request: all 1 rows were dropped \(ContextTokens or GeneratedTokens is 0"):
        load_workload(str(path))


def test_tracelab_repaced_starts_subsample_to_q_and_m_rates(tmp_path):
    rows = [_tl_row(f"s{i}", k, prefix=0 if k == 0 else 100 * k, append=100) for i in range(60) for k in range(10)]
    wl = load_workload(str(_write_jsonl(tmp_path / "t.jsonl", rows)))
    assert workload_stats(wl)["request_rate"] == pytest.approx(7.0)
    for rate in (3.0, 5.0):  # Q1, Q2
        q = subsample(wl, rate=rate, seed=1)
        assert workload_stats(q)["request_rate"] == pytest.approx(rate, rel=0.05)
        m = subsample(q, fraction=0.25, seed=1)  # M1, M2
        assert len(m.sessions) == round(0.25 * len(q.sessions))


# --- invariants: every row is kept once or reported as dropped ----------------------------
_tl_rows = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(0, 3000), st.integers(0, 500), st.integers(0, 300)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=_tl_rows)
def test_tracelab_never_loses_or_duplicates_an_unreported_row(tmp_path, rows):
    data = [_tl_row(f"s{s}", k, prefix=p, append=a, out=o) for s, k, p, a, o in rows]
    path = _write_jsonl(tmp_path / "h.jsonl", data)
    try:
        wl = load_workload(str(path), "tracelab")
    except CodaError as err:
        assert "no replayable request" in str(err)
        return
    load = wl.meta["load"]
    assert load["rows"] == len(data)
    assert wl.num_requests == load["kept_rows"] == len(data) - sum(d["rows"] for d in load["dropped"].values())
    outputs = sorted(r.output_tokens for s in wl.sessions for r in s.rounds)
    kept = {}
    for r in data:  # the first row of each (session, round) with a replayable prompt and output
        if r["output_tokens"] and r["prefix_tokens"] + r["newly_append_tokens"]:
            kept.setdefault((r["session_id"], r["round_index"]), r)
    assert outputs == sorted(r["output_tokens"] for r in kept.values())
    prompts = sorted(p for s in wl.sessions for _, p in session_prompts(s))
    assert prompts == sorted(r["prefix_tokens"] + r["newly_append_tokens"] for r in kept.values())


@st.composite
def _mooncake_rows(draw):
    """Conversations that extend their own hashes, sharing a system-prompt block, interleaved in time."""
    n = draw(st.integers(1, 25))
    rows, convs, next_id, t = [], [], 1, 0
    for _ in range(n):
        t += draw(st.integers(0, 3))
        if convs and draw(st.booleans()):
            c = draw(st.sampled_from(convs))
        else:
            c = [0]
            convs.append(c)
        grow = draw(st.integers(1, 4))
        c.extend(range(next_id, next_id + grow))
        next_id += grow
        length = (len(c) - 1) * 512 + draw(st.integers(1, 512))
        rows.append({"timestamp": t, "input_length": length, "output_length": draw(st.integers(0, 50)), "hash_ids": list(c)})
        if draw(st.booleans()):  # the next turn re-sends a different partial block
            c[-1] = next_id
            next_id += 1
    return rows


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=_mooncake_rows())
def test_mooncake_never_loses_or_duplicates_an_unreported_row(tmp_path, rows):
    path = _write_jsonl(tmp_path / "m.jsonl", rows)
    try:
        wl = load_workload(str(path), "mooncake")
    except CodaError as err:
        assert "no replayable request" in str(err)
        return
    kept = [r for r in rows if r["output_length"]]
    assert wl.meta["load"]["kept_rows"] == wl.num_requests == len(kept)
    got = sorted((r.at_s, r.output_tokens, r.block_hashes) for s in wl.sessions for r in s.rounds)
    assert got == sorted((r["timestamp"] / 1000, r["output_length"], r["hash_ids"]) for r in kept)
    for s in wl.sessions:
        for prev, cur in zip(s.rounds, s.rounds[1:]):
            k = cur.prefix_tokens // 512
            assert cur.block_hashes[:k] == prev.block_hashes[:k] and cur.at_s >= prev.at_s
