"""`coda serve` recognises agent sessions from what the clients send, end to end on loopback in
front of a `coda fake-engine`: a Responses API chain through the official `openai` client
(``previous_response_id``), a Claude Code /v1/messages request and a Codex /v1/responses request with
their own headers. The decision log names each request's session and the rule that found it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.gateway.identity import session_key
from coda.serving.procs import running
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
SID = "4f0a3c1e-8d2b-4e61-9a57-0c3d2b1a9e88"


def test_sessions_are_recognised_from_what_agent_clients_send(tmp_path: Path):
    log = tmp_path / "decisions.jsonl"
    cfg = tmp_path / "coda.yaml"
    with FakeEngineProcess("--speedup", "4") as engine:
        cfg.write_text(yaml.safe_dump({"backends": [engine.url], "decision_log": str(log)}))
        with running("serve", "--config", str(cfg), "--port", "0") as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none")
            first = client.responses.create(model=MODEL, input="write a tokenizer for the config format", max_output_tokens=4)
            client.responses.create(model=MODEL, previous_response_id=first.id, max_output_tokens=4,
                                    input=[{"type": "message", "role": "user", "content": "now add tests"}])
            claude = httpx.post(
                gw.url + "/v1/messages",
                timeout=60,
                headers={
                    "anthropic-version": "2023-06-01",
                    "x-app": "cli",
                    "user-agent": "claude-cli/2.1.90 (external, cli)",
                    "X-Claude-Code-Session-Id": SID,
                },
                json={
                    "model": MODEL,
                    "max_tokens": 4,
                    "metadata": {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": SID})},
                    "system": [{"type": "text", "text": "You are Claude Code."}],
                    "messages": [{"role": "user", "content": "fix it"}],
                },
            )
            codex = httpx.post(
                gw.url + "/v1/responses",
                timeout=60,
                headers={"originator": "codex_cli_rs", "session_id": "conv-7"},
                json={
                    "model": MODEL,
                    "instructions": "You are Codex.",
                    "input": [{"type": "message", "role": "user", "content": "ship it"}],
                    "prompt_cache_key": "conv-7",
                    "store": False,
                    "max_output_tokens": 4,
                },
            )
            assert claude.status_code == 200 and codex.status_code == 200
            wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 4, what="four decision records")
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    by_path = [(r["path"], r["session_source"], r["session"]) for r in recs]
    responses = [r for r in by_path if r[0] == "/v1/responses" and r[1] != "session_id"]
    assert [src for _, src, _ in responses] == ["prefix", "previous_response_id"] and responses[0][2] == responses[1][2]
    assert ("/v1/messages", "x-claude-code-session-id", session_key("default", SID)) in by_path
    assert ("/v1/responses", "session_id", session_key("default", "conv-7")) in by_path
