"""Which HTTP client the gateway's relay should read engines with: the CPU one streamed request
costs the client process, per library, against one fake engine, in one run.

Each client sends the same streamed chat (a ``--prompt-words`` prompt, ``--output`` tokens) to a
``coda fake-engine`` one request at a time, on uvloop as ``coda serve`` runs, and reads every chunk
as the relay does (without parsing it). The CPU is this process's user + system time over the
requests; the clients take turns in ``--repeats`` rounds, so a busy machine slows each of them
alike, and the table shows each one's median and range over the rounds.

    python benchmarks/bench_upstream_client.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import uvloop

from coda.engines.launch import FakeEngineProcess
from coda.protocol import tokenizer as tok

Client = Callable[[str, bytes], Awaitable[int]]


async def clients() -> dict[str, tuple[Client, Callable[[], Awaitable[None]]]]:
    """name -> (send one request and read its stream, returning its chunks; close)."""
    transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))

    async def via_httpx(url: str, body: bytes) -> int:
        req = httpx.Request("POST", url, content=body, headers={"content-type": "application/json"})
        resp = await transport.handle_async_request(req)
        n = 0
        async for _ in resp.aiter_raw():
            n += 1
        await resp.aclose()
        return n

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def via_aiohttp(url: str, body: bytes) -> int:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            n = 0
            async for _ in resp.content.iter_any():
                n += 1
            return n

    return {"httpx (httpcore, h11)": (via_httpx, transport.aclose), "aiohttp (C parser)": (via_aiohttp, session.close)}


async def measure(url: str, body: bytes, requests: int, repeats: int) -> dict[str, list[tuple[float, int]]]:
    out: dict[str, list[tuple[float, int]]] = {}
    cs = await clients()
    for send, _ in cs.values():
        await send(url, body)  # connections and imports warm
    for _ in range(repeats):
        for name, (send, _) in cs.items():
            c0, chunks = time.process_time(), 0
            for _ in range(requests):
                chunks += await send(url, body)
            out.setdefault(name, []).append((1000 * (time.process_time() - c0) / requests, chunks // requests))
    for _, close in cs.values():
        await close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20, help="requests per client per round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=8000)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--speedup", type=float, default=2.0, 
                    help="the fake engine's virtual seconds per wall second (slow enough that each token is a chunk)")
    args = ap.parse_args()
    body = json.dumps({"model": "coda-fake", "messages": [{"role": "user", "content": tok.text(1, args.prompt_words)}],
                       "max_tokens": args.output, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    with FakeEngineProcess("--speedup", str(args.speedup)) as engine:
        res = uvloop.run(measure(engine.url + "/v1/chat/completions", body, args.requests, args.repeats))
    print(f"{args.requests} streamed requests x {args.repeats} rounds, {args.prompt_words}-word prompt, {args.output} output tokens")
    for name, rows in res.items():
        ms = [r[0] for r in rows]
        print(f"{name:24s} CPU per request {statistics.median(ms):6.3f} ms ({min(ms):.3f}-{max(ms):.3f}), {rows[0][1]} chunks read")


if __name__ == "__main__":
    main()
