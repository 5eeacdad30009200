"""The shared tokenizer and template: append-only conversations, chained block hashes that match
exactly where token prefixes match, deterministic text of the requested size."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from coda.protocol import tokenizer as tok

word = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
messages = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), st.lists(word, max_size=6).map(" ".join)),
                    min_size=1, max_size=5)


@given(messages, messages)
def test_a_prompt_plus_its_reply_is_a_prefix_of_the_next_prompt(history, more):
    reply = "alpha beta gamma"
    prompt = tok.render(history)
    nxt = tok.render([*history, ("assistant", reply), *more])
    assert nxt[: len(prompt) + 3] == prompt + reply.split()
    assert len(prompt) == sum(len(t.split()) + tok.MESSAGE_OVERHEAD for _, t in history) + tok.GENERATION_PROMPT


@given(st.lists(word, max_size=80), st.lists(word, max_size=80), st.sampled_from([1, 4, 16]))
def test_block_hashes_agree_exactly_on_the_blocks_of_the_common_prefix(a, b, block):
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    ha, hb = tok.block_hashes(a, block), tok.block_hashes(b, block)
    assert len(ha) == len(a) // block
    shared = sum(1 for x, y in zip(ha, hb) if x == y)
    assert shared == common // block  # a block matches only when its whole prefix does
    assert ha[:shared] == hb[:shared]


@given(st.integers(0, 2**64 - 1), st.integers(0, 2000))
def test_generated_text_has_the_requested_size_and_is_deterministic(seed, n):
    text = tok.text(seed, n)
    assert tok.count_tokens(text) == n and text == tok.text(seed, n)
    assert all(not w.startswith("<|") for w in text.split())


def test_seeds_token_ids_and_hashes_are_the_same_in_another_process():
    # Python's hash() is salted per process; the bench and the engine run in different ones.
    code = ("from coda.protocol import tokenizer as t; w = t.words(t.seed_of('s1', 0, 'input'), 40); "
            "print(t.seed_of('s1', 0, 'input'), t.token_ids(w)[:3], t.block_hashes(w, 16))")
    here = tok.words(tok.seed_of("s1", 0, "input"), 40)
    expected = f"{tok.seed_of('s1', 0, 'input')} {tok.token_ids(here)[:3]} {tok.block_hashes(here, 16)}"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True
    )
    assert out.stdout.strip() == expected
