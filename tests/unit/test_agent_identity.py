"""Agents recognised as they are: each client's requests, with the headers and body fields that
client sends (its public source, cited in docs/gateway.md), map every round of one conversation to
one session key and two conversations to two. Order: the client's own identifiers, the session of
the response a Responses API request continues, Coda's ``x-session-id``, then the prefix hash."""

from __future__ import annotations

import json

from starlette.datastructures import Headers

from coda.gateway.identity import ResponseChains, response_id, session_key, session_of

S1, S2 = "4f0a3c1e-8d2b-4e61-9a57-0c3d2b1a9e88", "b4e5aaaa-9a3e-47c4-84ad-3a70f38c676e"
T = "team"


def key(
    path: str, headers: dict[str, str], body: dict, chains: ResponseChains | None = None, tenant: str = T
) -> tuple[str | None, str | None]:
    return session_of(tenant, path, Headers(headers), body, chains or ResponseChains())


def claude_code(sid: str, version: str, messages: list[dict]) -> tuple[dict[str, str], dict]:
    """A Claude Code /v1/messages request: until v2.1.78 the session ends ``metadata.user_id``
    (``user_<hash>_account_<uuid>_session_<uuid>``), since then that field is a JSON string, and
    from v2.1.86 the ``X-Claude-Code-Session-Id`` header carries it too."""
    major = tuple(int(x) for x in version.split("."))
    user_id = (
        json.dumps({"device_id": "9f" * 32, "account_uuid": "", "session_id": sid})
        if major >= (2, 1, 78)
        else f"user_{'9f' * 32}_account__session_{sid}"
    )
    headers = {
        "anthropic-version": "2023-06-01",
        "x-app": "cli",
        "user-agent": f"claude-cli/{version} (external, cli)",
        "anthropic-beta": "claude-code-20250219",
        "content-type": "application/json",
    }
    if major >= (2, 1, 86):
        headers["X-Claude-Code-Session-Id"] = sid
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": True,
        "metadata": {"user_id": user_id},
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}],
        "messages": messages,
    }
    return headers, body


def test_claude_code_every_version_names_its_session():
    round1 = [{"role": "user", "content": [{"type": "text", "text": "fix the failing test"}]}]
    round2 = [
        *round1,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "pytest"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 failed"}]},
    ]
    keys = set()
    for version, source in (("2.1.69", "metadata.user_id"), ("2.1.80", "metadata.user_id"), ("2.1.90", "x-claude-code-session-id")):
        for messages in (round1, round2):
            k, src = key("/v1/messages", *claude_code(S1, version, messages))
            assert src == source
            keys.add(k)
    assert keys == {session_key(T, S1)}
    assert key("/v1/messages", *claude_code(S2, "2.1.90", round1))[0] != session_key(T, S1)  # another session, same opening


def codex(sid: str, input_items: list[dict], headers: bool = True, legacy: bool = False) -> tuple[dict[str, str], dict]:
    """A Codex CLI /v1/responses request: the conversation id in the ``session_id`` header (older
    releases also ``conversation_id``) and as ``prompt_cache_key``."""
    h = {
        "originator": "codex_cli_rs",
        "user-agent": "codex_cli_rs/0.46.0",
        "openai-beta": "responses=experimental",
        "accept": "text/event-stream",
    }
    if headers:
        h["session_id"] = sid
        if legacy:
            h["conversation_id"] = sid
    body = {
        "model": "gpt-5-codex",
        "instructions": "You are Codex, based on GPT-5.",
        "input": input_items,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "stream": True,
        "include": [],
        "prompt_cache_key": sid,
    }
    return h, body


def test_codex_names_its_conversation_in_a_header_and_in_prompt_cache_key():
    turn1 = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add a CLI flag"}]}]
    turn2 = [
        *turn1,
        {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "src tests"},
    ]
    assert key("/v1/responses", *codex(S1, turn1)) == (session_key(T, S1), "session_id")
    assert key("/v1/responses", *codex(S1, turn2, legacy=True)) == (session_key(T, S1), "session_id")
    # a proxy in between that drops headers with underscores (nginx does by default): the body still names it
    assert key("/v1/responses", *codex(S1, turn2, headers=False)) == (session_key(T, S1), "prompt_cache_key")
    assert key("/v1/responses", *codex(S2, turn1))[0] == session_key(T, S2)


def opencode(sid: str, messages: list[dict], provider: str) -> tuple[dict[str, str], dict]:
    """An OpenCode request: to its own gateway ``x-opencode-session`` (with project and request ids);
    to another OpenAI-compatible provider ``x-session-affinity`` (and ``x-parent-session-id`` in a
    subagent); to OpenAI ``prompt_cache_key`` as well."""
    h = {"user-agent": "opencode/1.0.150"}
    body: dict = {"model": "qwen3-coder", "messages": messages, "stream": True}
    if provider == "opencode":
        h |= {"x-opencode-project": "prj_1", "x-opencode-session": sid, "x-opencode-request": "msg_9", "x-opencode-client": "cli"}
    elif provider == "compatible":
        h |= {"x-session-affinity": sid, "x-parent-session-id": "ses_parent"}
    else:
        body["prompt_cache_key"] = sid
    return h, body


def test_opencode_names_its_session_for_each_kind_of_provider():
    sid = "ses_3f9a1c2b7ffeSWk2yVb7d1Yq0"
    msgs = [{"role": "system", "content": "You are opencode, an interactive CLI tool."}, {"role": "user", "content": "rename the module"}]
    found = {provider: key("/v1/chat/completions", *opencode(sid, msgs, provider)) for provider in ("opencode", "compatible", "openai")}
    assert {k for k, _ in found.values()} == {session_key(T, sid)}
    assert [s for _, s in found.values()] == ["x-opencode-session", "x-session-affinity", "prompt_cache_key"]


def test_responses_api_chains_continue_the_session_of_the_answer_they_follow():
    chains = ResponseChains()
    first = {"model": "m", "input": "write a parser", "store": True}
    k1, src = key("/v1/responses", {}, first, chains)
    assert src == "prefix" and k1 is not None
    created = b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_0a1b2c3d","object":"response"'
    rid = response_id(created)
    assert rid == "resp_0a1b2c3d" and response_id(b'{"id":"resp_9","object":"response"}') == "resp_9"
    chains.record(rid, T, k1)
    then = {"model": "m", "previous_response_id": rid, "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    assert key("/v1/responses", {}, then, chains) == (k1, "previous_response_id")
    assert key("/v1/responses", {}, then, chains, tenant="other")[1] == "prefix"  # another tenant cannot continue it
    # the Responses API's own conversation object names it as well
    assert key("/v1/responses", {}, {"model": "m", "conversation": {"id": "conv_7"}, "input": "hi"}) == (
        session_key(T, "conv_7"),
        "conversation",
    )


def test_the_order_client_ids_then_coda_header_then_prefix_hash():
    body = {"model": "m", "messages": [{"role": "system", "content": "agent"}, {"role": "user", "content": "task A"}]}
    assert key("/v1/chat/completions", {"x-session-id": "mine", "x-claude-code-session-id": S1}, body)[1] == "x-claude-code-session-id"
    assert key("/v1/chat/completions", {"x-session-id": "mine"}, body) == (session_key(T, "mine"), "x-session-id")
    assert key("/v1/chat/completions", {}, {**body, "metadata": {"session_id": "m"}, "user": "u"})[1] == "metadata.session_id"
    assert key("/v1/chat/completions", {}, {**body, "user": "u"})[1] == "user"
    # no identifier at all: every round of one conversation opens alike, so it hashes alike
    later = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "done"}, {"role": "user", "content": "now B"}]}
    k, src = key("/v1/chat/completions", {}, body)
    assert src == "prefix" and key("/v1/chat/completions", {}, later)[0] == k
    other_task = {**body, "messages": [body["messages"][0], {"role": "user", "content": "task C"}]}
    assert key("/v1/chat/completions", {}, other_task)[0] != k
    assert key("/v1/chat/completions", {}, {"model": "m"}) == (None, None)
    assert key("/v1/messages", {}, {"metadata": {"user_id": "not-claude-code"}, "messages": []}) == (None, None)
