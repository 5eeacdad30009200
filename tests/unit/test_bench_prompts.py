"""Replayed conversations have the trace's prompt sizes and reuse the trace's prefixes (under the
shared tokenizer), including group system prompts and cache-breaking edits. A prefix that ends
exactly at a message boundary also shares the next message's role marker, one token more than
the trace says, as any chat template would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coda.bench.prompts import Conversation
from coda.protocol import tokenizer as tok
from coda.workload.schema import Round, Session, session_prompts
from coda.workload.spec import load_workload


@st.composite
def sessions(draw) -> Session:
    group = draw(st.sampled_from([None, "claude-code"]))
    n = draw(st.integers(1, 6))
    rounds, context = [], 0
    for k in range(n):
        prefix = None
        if k == 0 and group:
            prefix = draw(st.integers(2, 300))
        elif k > 0 and draw(st.booleans()):
            prefix = draw(st.integers(0, context))  # a cache-breaking edit keeps this much of the context
        new = draw(st.integers(4, 400))
        out = draw(st.integers(1, 60))
        rounds.append(Round(new_input_tokens=new, output_tokens=out, prefix_tokens=prefix))
        context = (prefix if prefix is not None else (context if k else 0)) + new + out
    return Session(session_id=draw(st.text("abc", min_size=1, max_size=4)), start_s=0.0, rounds=rounds, prefix_group=group)


def common_prefix(a: list[str], b: list[str]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def replay(session: Session, reply_len=lambda k, r: r.output_tokens):
    conv, prev = Conversation(session), None
    for k, ((prefix, prompt), rnd) in enumerate(zip(session_prompts(session), session.rounds)):
        words = tok.render((m.role, m.text) for m in conv.prompt(k))
        yield prefix, prompt, words, prev, conv
        out = tok.words(tok.seed_of("reply", k), reply_len(k, rnd))
        conv.reply(" ".join(out))
        prev = words + out


@settings(max_examples=150)
@given(sessions())
def test_prompt_sizes_and_reuse_follow_the_trace(session):
    for prefix, prompt, words, prev, conv in replay(session):
        assert len(words) == prompt == conv.prompt_tokens
        if prev is not None:
            assert prefix <= common_prefix(prev, words) <= prefix + 1


def test_sessions_of_one_group_share_their_system_prompt_and_nothing_more():
    wl = load_workload("synth:rate=3,duration=600,seed=4")
    a, b = [s for s in wl.sessions if s.prefix_group == "claude-code"][:2]
    pa = tok.render((m.role, m.text) for m in Conversation(a).prompt(0))
    pb = tok.render((m.role, m.text) for m in Conversation(b).prompt(0))
    assert a.rounds[0].prefix_tokens == b.rounds[0].prefix_tokens == 15_000
    assert common_prefix(pa, pb) == 15_000 + 1  # the system prompt, then the user message's role marker


def test_the_text_actually_returned_is_what_the_next_prompt_carries():
    session = Session(session_id="s", start_s=0.0, rounds=[Round(new_input_tokens=50, output_tokens=20) for _ in range(3)])
    # An engine that stops early: the context holds what it returned, not the trace's length.
    rows = list(replay(session, reply_len=lambda k, r: 5))
    for _, _, words, prev, _ in rows[1:]:
        assert words[: len(prev)] == prev  # previous prompt + the 5 words returned, then the new input
    assert len(rows[1][2]) == 50 + 5 + 50  # the trace said 20 output tokens; 5 came back
