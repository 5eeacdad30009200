"""The agent burst's ``tool-pauses`` variant: a round followed by tool calls asks the engine to
write them, in the format the vLLM scheduler's retention reads, and the variant's sessions pause
for the published tool times (``coda.bench.burst.sessions_of``, ``Endpoint.body``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.bench.burst import VARIANTS, Sessions, burst_workload, sessions_of
from coda.bench.client import Endpoint, tool_call_regex, tool_call_text
from coda.bench.prompts import Message
from coda.errors import CodaError
from coda.integrations.vllm.settings import DEFAULT_TOOL_CALL_PATTERN
from coda.workload.synth import TOOL_BANDS

NAMES = sorted({name for _, band in TOOL_BANDS for name, _ in band})
MESSAGES = [Message("user", "list the files", 3)]


def body(tools: list[str], max_tokens: int = 5, ignore_eos: bool = True) -> dict:
    return json.loads(Endpoint("http://127.0.0.1:1", model="m", api="completions", ignore_eos=ignore_eos).body(MESSAGES, max_tokens, tools))


@given(st.lists(st.sampled_from(NAMES + ["mcp__fs.read_file", "a+b(c)"]), min_size=1, max_size=4))
def test_the_forced_calls_are_the_regex_s_only_match_and_retention_reads_their_names(names):
    text = "".join(tool_call_text(n) for n in names)
    assert re.fullmatch(tool_call_regex(names), text)
    assert not re.fullmatch(tool_call_regex(names), text + " ")
    # what the scheduler's retention finds in the engine's output: the same calls, in order
    found = [m.group("name") or m.group("function") for m in re.finditer(DEFAULT_TOOL_CALL_PATTERN, text)]
    assert found == names


def test_a_round_with_tool_calls_asks_for_them_and_lets_the_grammar_end_it():
    req = body(["Bash", "Read"])
    assert req["structured_outputs"] == {"regex": tool_call_regex(["Bash", "Read"])}
    assert "ignore_eos" not in req  # ignoring the end of sequence would run past the grammar's end
    # room for the calls spelled byte by byte, the tokenizer's longest spelling
    assert req["max_tokens"] > len((tool_call_text("Bash") + tool_call_text("Read")).encode())
    assert body(["Bash"], max_tokens=500)["max_tokens"] == 500


def test_a_round_without_tool_calls_is_sent_as_before():
    req = body([])
    assert "structured_outputs" not in req and req["ignore_eos"] is True and req["max_tokens"] == 5
    assert "ignore_eos" not in body([], ignore_eos=False)


def test_the_tool_pauses_variant_unscales_tool_times_and_has_the_engine_write_the_calls():
    base, variant = Sessions(), sessions_of("tool-pauses")
    assert (variant.tool_scale, variant.tool_calls) == (1.0, True) and (base.tool_scale, base.tool_calls) == (0.05, False)
    assert sessions_of(None) == base
    # every other field is the default burst's, and an option given goes over the variant
    assert {k: v for k, v in vars(variant).items() if k not in VARIANTS["tool-pauses"]} == {
        k: v for k, v in vars(base).items() if k not in VARIANTS["tool-pauses"]}
    assert sessions_of("tool-pauses", tool_scale=0.5, max_rounds=None).tool_scale == 0.5
    pauses = [r.tool_duration_s for s in burst_workload(variant, 1.2, 0).sessions for r in s.rounds[:-1] if r.tools]
    scaled = [r.tool_duration_s for s in burst_workload(base, 1.2, 0).sessions for r in s.rounds[:-1] if r.tools]
    assert sorted(pauses)[len(pauses) // 2] == pytest.approx(20 * sorted(scaled)[len(scaled) // 2], rel=0.01)


def test_an_unknown_variant_names_the_valid_ones():
    with pytest.raises(CodaError, match="--variant nope: unknown; valid: tool-pauses"):
        sessions_of("nope")


def test_the_burst_engines_tokenizer_spells_every_forced_call(tmp_path: Path):
    from tokenizers import Tokenizer

    from coda.engines.vllm_cpu import word_tokenizer

    (tmp_path / "m").mkdir()
    tok = Tokenizer.from_file(str(word_tokenizer(tmp_path / "m") / "tokenizer.json"))
    text = "".join(tool_call_text(n) for n in NAMES)
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.token_to_id("<unk>") not in ids and tok.decode(ids) == text
