"""The vLLM plugin's engine-free parts with fakes: the external-tier probe's arithmetic, the tool-call
reader, and the settings' one-line errors. (Against real vLLM classes, 0.32's and 0.33's:
tests/integration/vllm/test_vllm_interfaces.py; in real engines: test_vllm_mechanisms.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from coda.errors import CodaError
from coda.integrations.vllm.settings import CONFIG_ENV, DEFAULT_TOOL_CALL_PATTERN, load_settings
from coda.integrations.vllm.tiers import ChunkGroup, NoTiers, OffloadedPrefix
from coda.integrations.vllm.tool_calls import ToolCallReader

HIT, PENDING, MISS = "hit", "pending", "miss"


class Store:
    """An offloading manager's ``lookup``: keys present with a result; the rest miss; every call counted."""

    def __init__(self, present: dict[tuple[object, int], str]) -> None:
        self.present = present
        self.calls = 0

    def lookup(self, key: tuple[object, int], req_context: object) -> str:
        self.calls += 1
        return self.present.get(key, MISS)


def probe(store: Store, *groups: ChunkGroup) -> OffloadedPrefix:
    return OffloadedPrefix(store, groups or (ChunkGroup(0, 32, 1),), lambda h, g: (h, g), frozenset({HIT, PENDING}))


def request(tokens: int, hash_tokens: int = 32) -> SimpleNamespace:
    return SimpleNamespace(num_tokens=tokens, block_hashes=[f"h{i}" for i in range(tokens // hash_tokens)])


def test_the_dram_run_starts_after_the_hbm_hit_and_stops_at_the_first_missing_chunk():
    store = Store({(f"h{i}", 0): HIT for i in range(2, 6)} | {("h6", 0): PENDING, ("h8", 0): HIT})
    p = probe(store)
    assert p.tokens(request(320), 64) == (5 * 32, 0)  # chunks 2..6 (one still being written), then a gap at 7
    assert p.tokens(request(320), 32) == (0, 0)  # chunk 1 is missing: nothing continues the HBM hit
    assert p.tokens(request(320), 7 * 32) == (0, 0)
    assert p.still_valid(request(320), 64, 160) and not p.still_valid(request(320), 64, 128)
    del store.present[("h6", 0)]
    assert not p.still_valid(request(320), 64, 160)  # the run's last chunk was evicted


def test_the_last_token_is_never_counted_held_and_several_groups_count_their_shortest_run():
    p = probe(Store({(f"h{i}", 0): HIT for i in range(10)}))
    assert p.tokens(request(320), 0) == (288, 0)  # 320 tokens: the tenth chunk holds the last one, which is computed
    assert p.tokens(request(321), 0) == (320, 0)
    two = probe(
        Store({(f"h{i}", g): HIT for i in range(10) for g in (0, 1) if (g, i) != (1, 4)}), ChunkGroup(0, 32, 1), ChunkGroup(1, 32, 1)
    )
    assert two.tokens(request(321), 0) == (128, 0)


def test_a_chunk_of_several_blocks_is_keyed_by_its_last_block_hash():
    store = Store({("h1", 0): HIT, ("h3", 0): HIT})
    p = probe(store, ChunkGroup(0, 64, 2))
    assert p.tokens(request(321, 32), 0) == (128, 0) and store.calls == 3  # chunks 0, 1 hit; chunk 2 (h5) misses


def test_no_tiers_reads_nothing():
    n = NoTiers("off")
    assert n.tokens(request(320), 0) == (0, 0) and n.still_valid(request(320), 0, 0)


class Chars:
    """A tokenizer whose token ids are character codes."""

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def codes(text: str) -> list[int]:
    return [ord(c) for c in text]


@pytest.mark.parametrize(
    ("text", "tools"),
    [
        ('I will look.<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>', ("bash",)),
        (
            '<tool_call>{"name": "grep"}</tool_call><tool_call>{"name": "sed"}</tool_call><tool_call>{"name": "grep"}</tool_call>',
            ("grep", "sed"),
        ),
        (
            "<tool_call>\n<function=str_replace_editor>\n<parameter=path>a.py</parameter>\n</function>\n</tool_call>",
            ("str_replace_editor",),
        ),
        ("The answer is 42.", ()),
    ],
)
def test_tool_calls_are_read_from_the_output_in_the_default_formats(text, tools):
    assert ToolCallReader(Chars(), DEFAULT_TOOL_CALL_PATTERN, 512).tools(codes(text)) == tools


def test_only_the_tail_of_the_output_is_read():
    out = codes('<tool_call>{"name": "bash"}</tool_call>' + "x" * 100)
    assert ToolCallReader(Chars(), DEFAULT_TOOL_CALL_PATTERN, 100).tools(out) == ()
    assert ToolCallReader(Chars(), DEFAULT_TOOL_CALL_PATTERN, 200).tools(out) == ("bash",)


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"retention": {"tool_call_pattern": "(unclosed"}}, ("retention.tool_call_pattern", "not a regular expression")),
        ({"retention": {"tool_call_pattern": "name: (\\w+)"}}, ("retention.tool_call_pattern", "named group")),
        ({"retention": {"prior_s": 0}}, ("retention.prior_s",)),
        ({"tiers": "yes"}, ("tiers",)),
        ({"cohorts": True}, ("cohorts", "valid keys")),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(config, names):
    with pytest.raises(CodaError) as err:
        load_settings({CONFIG_ENV: json.dumps(config)})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(CONFIG_ENV) and all(n in msg for n in names), msg


def test_the_mechanisms_default_to_every_one_on():
    s = load_settings({})
    spec = s.policy_spec
    assert s.tiers and s.retention.prior_s == 30.0
    assert (spec.state.name, spec.execution.name, spec.eviction.name) == ("tiered_aging", "cohort", "tool_aware")
