"""Whether vllm-router's own admission bounds streamed requests: its ``--max-concurrent-requests``
limit in front of one slow `coda fake-engine`, with concurrent requests, streamed and not.

vllm-router's limit is a token bucket (``--rate-limit-tokens-per-second`` refills it; without it
the refill equals the limit, per its ``--help``). A token taken when a request arrives goes back when
the router has the response to hand on. A benchmark that compares doors at overload needs to know
whether that is when the answer ends or when its headers are in: for a stream, the headers arrive
with the engine's first bytes, so the limit would bound requests in flight only until their
streams begin. This sends ``--requests`` requests at once through a limit of ``--limit`` at a refill
of ``--refill`` tokens a second and prints, per mode, the most requests the engine ran at once
(its ``vllm:num_requests_running``, polled every 50 ms) against the limit, and the statuses.

    python benchmarks/peer_limit_probe.py [--limit 2] [--refill 1] [--requests 6] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from coda.bench.doors import PEER_VERSION, peer_python, vllm_router
from coda.engines.launch import FakeEngineProcess

ROOT = Path(__file__).resolve().parents[1]


async def one(client: httpx.AsyncClient, url: str, stream: bool) -> dict:
    """One chat of 200 tokens: when its first byte came, when it ended, and its status."""
    body = {"model": "coda-fake", "messages": [{"role": "user", "content": "hello " * 50}], "max_tokens": 200,
            "ignore_eos": True, "stream": stream}
    t0 = time.monotonic()
    first = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        async for _ in resp.aiter_bytes():
            first = first if first is not None else time.monotonic() - t0
    return {"status": resp.status_code, "first_byte_s": first, "end_s": time.monotonic() - t0}


async def engine_peak(client: httpx.AsyncClient, engine: str, done: asyncio.Event) -> float:
    """The most requests the engine had in its batches (``vllm:num_requests_running``), polled every 50 ms."""
    peak = 0.0
    while not done.is_set():
        for line in (await client.get(engine + "/metrics")).text.splitlines():
            if line.startswith("vllm:num_requests_running{"):
                peak = max(peak, float(line.rsplit(" ", 1)[1]))
        await asyncio.sleep(0.05)
    return peak


async def burst(url: str, engine: str, n: int, stream: bool) -> tuple[list[dict], float]:
    """``n`` requests at once through ``url``: each one's times, and the engine's peak of requests running."""
    async with httpx.AsyncClient(timeout=120.0) as client:
        done = asyncio.Event()
        watch = asyncio.ensure_future(engine_peak(client, engine, done))
        runs = await asyncio.gather(*(one(client, url, stream) for _ in range(n)))
        done.set()
        return list(runs), await watch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=2, help="vllm-router's --max-concurrent-requests")
    ap.add_argument("--refill", type=int, default=1, help="its --rate-limit-tokens-per-second (an integer, as it parses it)")
    ap.add_argument("--requests", type=int, default=6, help="requests sent at once, per mode")
    ap.add_argument("--peer-venv", type=Path, default=ROOT / "runs" / "peers", help="where vllm-router's environment is made")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.limit < 1 or args.refill < 1 or args.requests <= args.limit:
        ap.error("--limit and --refill must be at least 1 and --requests more than --limit, so that the limit can bind")
    peer = peer_python(PEER_VERSION, args.peer_venv / f"vllm-router-{PEER_VERSION}")
    limit = ["--max-concurrent-requests", str(args.limit), "--rate-limit-tokens-per-second", str(args.refill),
             "--queue-size", "100", "--queue-timeout-secs", "60"]
    out: dict = {"vllm_router": PEER_VERSION, "limit": args.limit, "refill_per_s": args.refill, "requests": args.requests,
                 "engine": "coda fake-engine --speedup 1 (default profile)", "modes": {}}
    with FakeEngineProcess("--speedup", "1") as engine, tempfile.TemporaryDirectory() as tmp, \
            vllm_router(peer, [engine.url], Path(tmp) / "router.log", limit) as proxy:
        for mode, stream in (("streamed", True), ("not streamed", False)):
            runs, peak = asyncio.run(burst(proxy.url, engine.url, args.requests, stream))
            out["modes"][mode] = {"engine_running_peak": peak, "answered": sum(1 for r in runs if r["status"] == 200),
                                  "statuses": sorted({r["status"] for r in runs}), "runs": runs}
    if args.json:
        print(json.dumps(out))
        return
    print(f"vllm-router {PEER_VERSION}, --max-concurrent-requests {args.limit}, --rate-limit-tokens-per-second {args.refill}; "
          f"{args.requests} requests at once to one {out['engine']}")
    for mode, m in out["modes"].items():
        verdict = "bound" if m["engine_running_peak"] <= args.limit else "did NOT bind"
        print(f"  {mode}: the engine ran up to {m['engine_running_peak']:g} requests at once (the limit {verdict}); "
              f"{m['answered']} of {args.requests} answered 200, statuses {m['statuses']}")

if __name__ == "__main__":
    main()
