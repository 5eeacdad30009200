"""Harness overhead: `coda bench`'s client (httpx streaming, SSE parsing, records, retries) against
a minimal raw-socket streaming client, both driving the same `coda fake-engine` with the same
requests at the same open-loop rate, in the same run.

Goal: the harness sustains >= 300 streamed requests/s on the machine it runs on and adds
<= 1 ms to TTFT at p50 over what the baseline client measures.
Run: python benchmarks/bench_harness.py [--rates 100,300,400] [--seconds 6] [--repeats 3] [--speedup 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
from rich.console import Console
from rich.table import Table

from coda.bench.client import Endpoint
from coda.bench.prompts import Conversation
from coda.bench.replay import BenchConfig
from coda.bench.run import run_once
from coda.engines.launch import FakeEngineProcess
from coda.workload.schema import Round, Session, Workload

PROMPT_TOKENS = 64
OUTPUT_TOKENS = 16


def open_loop(rate: float, seconds: float) -> Workload:
    """Single-round sessions arriving every 1/rate s: the request rate is fixed, whatever the latency."""
    n = int(rate * seconds)
    sessions = [Session(session_id=f"h{i}", start_s=i / rate, rounds=[Round(new_input_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS)])
                for i in range(n)]
    return Workload(sessions=sessions, meta={"source": "bench_harness open loop", "rate": rate, "duration_s": seconds})


async def baseline(url: str, workload: Workload, model: str) -> tuple[float, list[float]]:
    """The least a streaming client can do: pre-built HTTP/1.1 requests on keep-alive sockets, the
    time of the first body chunk, read to the end of the chunked body. Returns (completed/s, TTFTs)."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    endpoint = Endpoint(url, model=model)  # only to build the same JSON bodies the harness sends
    bodies = [endpoint.body(Conversation(s).prompt(0), OUTPUT_TOKENS) for s in workload.sessions]
    await endpoint.close()
    free: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    ttfts: list[float] = []
    t0 = time.perf_counter()

    async def one(start: float, body: bytes) -> None:
        delay = start - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        conn = free.pop() if free else await asyncio.open_connection(host, port)
        reader, writer = conn
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        await reader.readuntil(b"\r\n\r\n")
        first = None
        while True:
            size = int((await reader.readline()).strip(), 16)
            if first is None:
                first = time.perf_counter()
            await reader.readexactly(size + 2)
            if size == 0:
                break
        ttfts.append(first - t0 - start)  # from the scheduled send time, as the harness measures
        free.append(conn)

    await asyncio.gather(*(one(s.start_s, b) for s, b in zip(workload.sessions, bodies)))
    elapsed = time.perf_counter() - t0
    for _, writer in free:
        writer.close()
    return len(ttfts) / elapsed, ttfts


async def harness(url: str, workload: Workload, model: str) -> tuple[float, list[float]]:
    cfg = BenchConfig(endpoint=url, model=model, drain_s=30.0)
    replay, summary = await run_once(workload, cfg, "open loop")
    done = [r for r in replay.records if r["state"] == "completed"]
    assert summary["failed"] == summary["rejected"] == 0, summary["failed_by_reason"]
    return len(done) / replay.wall_s, [r["ttft_s"] for r in done]


@dataclass
class Run:
    rps: float
    ttft_p50: float
    ttft_p95: float
    cpu_ms: float  # client CPU per completed request


def measure(client: Callable[[str, Workload, str], Awaitable[tuple[float, list[float]]]], url: str, wl: Workload) -> Run:
    cpu = time.process_time()
    rps, ttfts = asyncio.run(client(url, wl, "bench"))
    return Run(rps, float(np.percentile(ttfts, 50)), float(np.percentile(ttfts, 95)), (time.process_time() - cpu) * 1e3 / len(ttfts))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100,300,400", help="offered request rates (open loop)")
    ap.add_argument("--seconds", type=float, default=6.0, help="arrival window per run")
    ap.add_argument("--repeats", type=int, default=3, help="alternating baseline/harness runs per rate; medians are reported")
    ap.add_argument("--speedup", type=float, default=10.0, help="fake engine speedup")
    args = ap.parse_args(argv)
    console = Console()
    load = os.getloadavg()[0]
    table = Table(title=f"coda bench harness vs a raw-socket client (same run): coda fake-engine --speedup {args.speedup:g}, open loop, "
                        f"{PROMPT_TOKENS}-token prompts, {OUTPUT_TOKENS} streamed tokens; median of {args.repeats} alternating runs "
                        f"of {args.seconds:g} s; {os.cpu_count()} CPUs, load average {load:.1f} at start")
    for col in ("offered/s", "raw done/s", "bench done/s", "bench/raw", "raw TTFT p50", "bench TTFT p50", "overhead p50", "bench TTFT p95",
                "raw CPU/req", "bench CPU/req"):
        table.add_column(col, justify="right")
    ms = lambda x: f"{x * 1e3:.2f} ms"  # noqa: E731
    with FakeEngineProcess("--speedup", str(args.speedup), "--model", "bench") as engine:
        for rate in (float(r) for r in args.rates.split(",")):
            wl = open_loop(rate, args.seconds)
            runs: dict[str, list[Run]] = {"raw": [], "bench": []}
            for _ in range(args.repeats):
                runs["raw"].append(measure(baseline, engine.url, wl))
                runs["bench"].append(measure(harness, engine.url, wl))
            raw, bench = ({f: statistics.median(getattr(r, f) for r in v) for f in Run.__dataclass_fields__} for v in runs.values())
            table.add_row(f"{rate:g}", f"{raw['rps']:.0f}", f"{bench['rps']:.0f}", f"{bench['rps'] / raw['rps']:.3f}", ms(raw["ttft_p50"]),
                          ms(bench["ttft_p50"]), f"{(bench['ttft_p50'] - raw['ttft_p50']) * 1e3:+.2f} ms", ms(bench["ttft_p95"]),
                          f"{raw['cpu_ms']:.2f} ms", f"{bench['cpu_ms']:.2f} ms")
    console.print(table)
    console.print(f"done/s: completed requests / wall time of the run (arrivals and drain); TTFT from the scheduled send time to the first "
                  f"body chunk (raw) or first token (bench), the engine's own TTFT in both; CPU/req: client process CPU per completed "
                  f"request. Load average at the end: {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
