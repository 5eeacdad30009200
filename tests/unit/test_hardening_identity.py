"""Session identity never merges sessions that a client marks distinct: an id that names one
conversation (an agent client's own, Coda's ``x-session-id``) comes before a key that several
sessions may share (``prompt_cache_key``, ``user``)."""

from __future__ import annotations

from starlette.datastructures import Headers

from coda.gateway.identity import ResponseChains, session_key, session_of

T = "team"
BODY = {"model": "m", "prompt_cache_key": "shared-cache", "user": "alice", "messages": [{"role": "user", "content": "fix it"}]}


def key(headers: dict[str, str], body: dict, chains: ResponseChains | None = None) -> tuple[str | None, str | None]:
    return session_of(T, "/v1/chat/completions", Headers(headers), body, chains or ResponseChains())


def test_two_sessions_sharing_a_prompt_cache_key_are_two_sessions():
    a, b = key({"x-session-id": "s-1"}, BODY), key({"x-session-id": "s-2"}, BODY)
    assert a == (session_key(T, "s-1"), "x-session-id")
    assert b == (session_key(T, "s-2"), "x-session-id")
    assert a[0] != b[0]


def test_every_id_naming_one_conversation_comes_before_the_cache_key():
    assert key({}, {**BODY, "metadata": {"session_id": "m-1"}})[1] == "metadata.session_id"
    assert key({}, {**BODY, "conversation": "conv-1"})[1] == "conversation"
    assert key({"session_id": "codex-1"}, BODY)[1] == "session_id"
    # x-session-id before a Responses API chain too: the client's explicit mark wins
    chains = ResponseChains()
    chains.record("resp_1", T, "earlier")
    assert key({"x-session-id": "s-3"}, {**BODY, "previous_response_id": "resp_1"}, chains)[1] == "x-session-id"
    assert key({}, {**BODY, "previous_response_id": "resp_1"}, chains) == ("earlier", "previous_response_id")


def test_cache_key_then_user_then_prefix_when_nothing_names_the_session():
    assert key({}, BODY) == (session_key(T, "shared-cache"), "prompt_cache_key")
    assert key({}, {k: v for k, v in BODY.items() if k != "prompt_cache_key"})[1] == "user"
    assert key({}, {"model": "m", "messages": BODY["messages"]})[1] == "prefix"
