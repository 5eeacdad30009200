"""KV events from `coda fake-engine` as a vLLM consumer receives them: ZMQ PUB frames with
sequence numbers, msgpack batches of BlockStored/BlockRemoved whose hashes are the chained
hashes of the prompt's token blocks, and the replay socket."""

from __future__ import annotations

import socket

import httpx
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from coda.engines.launch import FakeEngineProcess
from coda.protocol import tokenizer as tok
from coda.protocol.kv_events import END_SEQ, BlockRemoved, BlockStored, decode_batch, decode_frames

CHUNK = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine():
    pub, replay = free_port(), free_port()
    # 0.05 GiB of HBM KV holds 34 blocks of 16 tokens: a few prompts evict earlier ones.
    args = ("--speedup", "50", "--chunk-tokens", str(CHUNK), "--hbm-kv-gib", "0.05", "--kv-events", f"tcp://*:{pub}",
            "--kv-events-replay", f"tcp://*:{replay}", "--kv-events-topic", "kv-events")
    with FakeEngineProcess(*args) as eng:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        joined(sub, f"tcp://127.0.0.1:{pub}")
        yield eng, sub, ctx, replay
        sub.close(linger=0)
        ctx.term()


def joined(sub: zmq.Socket, endpoint: str) -> None:
    """Connect and wait until the connection's handshake is done, after which the subscription
    goes out at once: PUB/SUB delivers only what is sent after a subscriber has joined."""
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.connect(endpoint)
    try:
        assert monitor.poll(120_000), f"no ZMQ handshake with {endpoint} (a hang guard)"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sub.disable_monitor()
        monitor.close(linger=0)


def receive(sub: zmq.Socket, quiet_s: float = 0.5) -> list[tuple[int, list]]:
    out = []
    while sub.poll(int(quiet_s * 1000)):
        frames = sub.recv_multipart()
        assert frames[0] == b"kv-events"
        seq, batch = decode_frames(frames)
        out.append((seq, batch.events))
    return out


def chat(url: str, words: str, max_tokens: int = 4) -> dict:
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": max_tokens}
    return httpx.post(url + "/v1/chat/completions", json=body).json()


def test_block_events_name_token_blocks_and_sequence_numbers_are_consecutive(engine):
    eng, sub, ctx, replay_port = engine
    prompt = tok.text(11, 120)
    chat(eng.url, prompt)
    got = receive(sub)
    seqs = [s for s, _ in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] == 0
    stored = [e for _, evs in got for e in evs if isinstance(e, BlockStored) and e.medium == "GPU"]
    words = tok.render([("user", prompt)])
    expected = tok.block_hashes(words, CHUNK)  # the prompt's full blocks
    first = stored[0]
    assert first.block_hashes == expected and first.parent_block_hash is None and first.block_size == CHUNK
    assert first.token_ids == tok.token_ids(words[: len(expected) * CHUNK])
    assert any(isinstance(e, BlockStored) and e.medium == "CPU" for _, evs in got for e in evs)  # CPU-shadow copies

    # The same prompt again stores nothing new on the GPU: its blocks are resident.
    r = chat(eng.url, prompt)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == len(expected) * CHUNK - (CHUNK if len(words) % CHUNK == 0 else 0)
    again = [e for _, evs in receive(sub) for e in evs if isinstance(e, BlockStored) and e.medium == "GPU"]
    assert not any(set(e.block_hashes) & set(expected) for e in again)

    # Distinct prompts overflow the 34-block pool: the first prompt's blocks are removed.
    for i in range(4):
        chat(eng.url, tok.text(100 + i, 200))
    removed = {h for _, evs in receive(sub) for e in evs if isinstance(e, BlockRemoved) and e.medium == "GPU" for h in e.block_hashes}
    assert set(expected) & removed

    # Replay: everything from sequence 2 on, then the end marker.
    req = ctx.socket(zmq.DEALER)  # a DEALER takes the ROUTER's several answers (a REQ takes one)
    req.connect(f"tcp://127.0.0.1:{replay_port}")
    req.send_multipart((b"", (2).to_bytes(8, "big")))
    replayed = []
    while True:
        assert req.poll(2000), "no replay answer"
        _, seq_bytes, payload = req.recv_multipart()
        if seq_bytes == END_SEQ:
            assert payload == b""
            break
        replayed.append(int.from_bytes(seq_bytes, "big"))
        decode_batch(payload)
    req.close(linger=0)
    assert replayed[0] == 2 and replayed == list(range(2, 2 + len(replayed)))
