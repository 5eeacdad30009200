"""What `coda serve` costs: the same requests sent straight to two `coda fake-engine` workers and
through the gateway, in one run, with the synthetic workload's prompt sizes.

Two measurements, each in both modes against freshly started engines (so neither mode inherits
the other's prefix cache):

- latency: one request at a time; the gateway's added latency is the difference of the p50
  end-to-end times of streamed requests (the same request sequence in both modes);
- throughput: ``--concurrency`` agent sessions in a closed loop, each sending its rounds back to
  back; completed requests and output tokens per wall second.

Direct mode pins each session to one engine (as a client-side affinity would); the gateway
routes with its defaults (admit_all, the coda router, character-block indexing).

    python benchmarks/bench_gateway.py            # the table below in docs/gateway.md
    python benchmarks/bench_gateway.py --quick    # a smaller run (smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from coda.bench.client import Endpoint
from coda.bench.prompts import Conversation
from coda.engines import tokenizer as tok
from coda.engines.launch import FakeEngineProcess
from coda.gateway.procs import running
from coda.workload.spec import load_workload

Body = tuple[str, bytes]  # (session id, request body)


@dataclass
class Result:
    wall_s: float
    completed: int
    failed: int
    output_tokens: int
    e2e_s: list[float]
    ttft_s: list[float]

    def p(self, xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def sessions(spec: str, n: int, rounds: int, max_output: int) -> list[list[Body]]:
    """Request bodies of ``n`` workload sessions, ``rounds`` each: the prompt grows by the
    workload's new input and a fixed stand-in for the reply (so both modes send identical bytes)."""
    wl = load_workload(spec, None)
    out: list[list[Body]] = []
    ep = Endpoint("http://unused", model="coda-fake")
    for sess in wl.sessions:
        if len(sess.rounds) < rounds:
            continue
        conv = Conversation(sess)
        bodies = []
        for k in range(rounds):
            msgs = conv.prompt(k)
            max_tokens = min(sess.rounds[k].output_tokens, max_output)
            bodies.append((sess.session_id, ep.body(msgs, max_tokens)))
            conv.reply(tok.text(tok.seed_of(sess.session_id, k, "reply"), max_tokens))
        out.append(bodies)
        if len(out) == n:
            break
    return out


async def drive(urls: list[str], work: list[list[Body]], concurrency: int, via_gateway: bool) -> Result:
    """Each of ``concurrency`` workers takes sessions off the list and sends their rounds in order."""
    endpoints = [Endpoint(u, model="coda-fake") for u in urls]
    queue = list(enumerate(work))
    e2e: list[float] = []
    ttft: list[float] = []
    res = Result(0.0, 0, 0, 0, e2e, ttft)

    async def worker() -> None:
        while queue:
            i, bodies = queue.pop(0)
            ep = endpoints[0] if via_gateway else endpoints[i % len(endpoints)]
            for sid, body in bodies:
                a = await ep.send(body, {"x-session-id": sid} if via_gateway else {})
                if not a.ok:
                    res.failed += 1
                    print(f"failed: {a.reason}", file=sys.stderr)
                    continue
                res.completed += 1
                res.output_tokens += a.tokens
                e2e.append(a.end_s - a.sent_s)  # type: ignore[operator]
                ttft.append(a.first_token_s - a.sent_s)  # type: ignore[operator]

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    res.wall_s = time.perf_counter() - t0
    for ep in endpoints:
        await ep.close()
    return res


@contextlib.contextmanager
def cluster(engine_args: list[str], via_gateway: bool) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(FakeEngineProcess(*engine_args)) for _ in range(2)]
        urls = [e.url for e in engines]
        if via_gateway:
            args = ["serve", "--port", "0"] + [x for u in urls for x in ("--backend", u)]
            urls = [stack.enter_context(running(*args)).url]
        yield urls


def measure(engine_args: list[str], work: list[list[Body]], concurrency: int, via_gateway: bool) -> Result:
    with cluster(engine_args, via_gateway) as urls:
        return asyncio.run(drive(urls, work, concurrency, via_gateway))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="synth:rate=3,duration=900,seed=0")
    ap.add_argument("--speedup", type=float, default=100.0, help="fake-engine virtual seconds per wall second")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4, help="rounds replayed per session")
    ap.add_argument("--max-output", type=int, default=256, help="cap on a round's output tokens")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--latency-requests", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="8 sessions, 2 rounds, 12 latency requests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.rounds, args.latency_requests = 8, 2, 12
    engine_args = ["--speedup", str(args.speedup)]
    work = sessions(args.workload, args.sessions, args.rounds, args.max_output)
    prompt_tokens = [len(json.loads(b)["messages"]) and sum(len(m["content"].split()) for m in json.loads(b)["messages"]) for s in work for _, b in s]
    flat = [[b] for s in work for b in s][: args.latency_requests]

    lat = {mode: measure(engine_args, flat, 1, mode == "gateway") for mode in ("direct", "gateway")}
    thr = {mode: measure(engine_args, work, args.concurrency, mode == "gateway") for mode in ("direct", "gateway")}

    d, g = thr["direct"], thr["gateway"]
    added_ms = (statistics.median(lat["gateway"].e2e_s) - statistics.median(lat["direct"].e2e_s)) * 1000
    added_ttft_ms = (statistics.median(lat["gateway"].ttft_s) - statistics.median(lat["direct"].ttft_s)) * 1000
    rows = {
        "requests/s": (d.completed / d.wall_s, g.completed / g.wall_s),
        "output tokens/s": (d.output_tokens / d.wall_s, g.output_tokens / g.wall_s),
        "p50 e2e s (loaded)": (statistics.median(d.e2e_s), statistics.median(g.e2e_s)),
        "p95 e2e s (loaded)": (d.p(d.e2e_s, 95), g.p(g.e2e_s, 95)),
        "p50 e2e ms (one at a time)": (statistics.median(lat["direct"].e2e_s) * 1000, statistics.median(lat["gateway"].e2e_s) * 1000),
        "p50 ttft ms (one at a time)": (statistics.median(lat["direct"].ttft_s) * 1000, statistics.median(lat["gateway"].ttft_s) * 1000),
        "failed requests": (d.failed + lat["direct"].failed, g.failed + lat["gateway"].failed),
    }
    summary = {
        "workload": args.workload, "speedup": args.speedup, "sessions": len(work), "rounds": args.rounds, "concurrency": args.concurrency,
        "prompt_tokens_mean": statistics.mean(prompt_tokens), "prompt_tokens_max": max(prompt_tokens),
        "throughput_ratio": (g.completed / g.wall_s) / (d.completed / d.wall_s),
        "added_p50_ms_per_streamed_request": added_ms, "added_p50_ttft_ms": added_ttft_ms,
        "rows": {k: {"direct": a, "gateway": b} for k, (a, b) in rows.items()},
    }
    if args.json:
        print(json.dumps(summary))
        return
    con = Console()
    con.print(f"{args.workload}: {len(work)} sessions x {args.rounds} rounds, prompts mean {summary['prompt_tokens_mean']:.0f} / "
              f"max {summary['prompt_tokens_max']} words, output <= {args.max_output}; 2 fake engines at speedup {args.speedup:g}; "
              f"{args.concurrency} concurrent sessions", highlight=False)
    table = Table("metric", "direct", "gateway", "gateway / direct")
    for k, (a, b) in rows.items():
        table.add_row(k, f"{a:.4g}", f"{b:.4g}", f"{b / a:.3f}" if a else "-")
    con.print(table)
    con.print(f"throughput ratio {summary['throughput_ratio']:.3f} (goal >= 0.8); added p50 latency per streamed request "
              f"{added_ms:.2f} ms (goal <= 2 ms), of which before the first token {added_ttft_ms:.2f} ms", highlight=False)


if __name__ == "__main__":
    main()
