"""What `coda serve` costs: the same requests sent straight to two `coda fake-engine` workers and
through the gateway, in one run, with the synthetic workload's prompt sizes.

Two measurements, each in both modes against freshly started engines (so neither mode inherits
the other's prefix cache):

- latency: one request at a time; the gateway's added latency is the difference of the p50
  end-to-end times of streamed requests (the same request sequence in both modes);
- throughput: ``--concurrency`` agent sessions in a closed loop, each sending its rounds back to
  back; completed requests and output tokens per wall second.

Both modes place requests the same way, so the comparison isolates what the proxy costs: direct
mode sends each request to the engine with fewer of this client's requests in flight, the
gateway runs ``--router least_loaded`` (and its other defaults: admit_all, character-block
indexing). A third column runs the gateway with its default ``coda`` router, for information.

At a high speedup the fake engines are bound by their own CPU, so on a small machine the
gateway's CPU (relaying every SSE chunk in Python) is taken from them; at a low speedup the
simulated GPU is the bottleneck, as in a deployment. Both are printed.

    python benchmarks/bench_gateway.py                  # the tables in docs/gateway.md (speedups 100 and 10)
    python benchmarks/bench_gateway.py --quick          # a smaller run (smoke test)
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
from coda.procs import running
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
    """Each of ``concurrency`` workers takes sessions off the list and sends their rounds in order;
    direct, each request goes to the endpoint with the fewest of our requests in flight."""
    endpoints = [Endpoint(u, model="coda-fake") for u in urls]
    inflight = [0] * len(endpoints)
    queue = list(work)
    e2e: list[float] = []
    ttft: list[float] = []
    res = Result(0.0, 0, 0, 0, e2e, ttft)

    async def worker() -> None:
        while queue:
            bodies = queue.pop(0)
            for sid, body in bodies:
                i = min(range(len(endpoints)), key=inflight.__getitem__)
                inflight[i] += 1
                try:
                    a = await endpoints[i].send(body, {"x-session-id": sid} if via_gateway else {})
                finally:
                    inflight[i] -= 1
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


MODES = {"direct": None, "gateway": "least_loaded", "gateway (coda router)": "coda"}


@contextlib.contextmanager
def cluster(engine_args: list[str], router: str | None) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(FakeEngineProcess(*engine_args)) for _ in range(2)]
        urls = [e.url for e in engines]
        if router is not None:
            args = ["serve", "--port", "0", "--router", router] + [x for u in urls for x in ("--backend", u)]
            urls = [stack.enter_context(running(*args)).url]
        yield urls


def measure(engine_args: list[str], work: list[list[Body]], concurrency: int, router: str | None) -> Result:
    with cluster(engine_args, router) as urls:
        return asyncio.run(drive(urls, work, concurrency, router is not None))


def run(speedup: float, work: list[list[Body]], flat: list[list[Body]], concurrency: int) -> dict:
    """Latency (one at a time) and throughput (closed loop) in every mode, against fresh engines each time."""
    engine_args = ["--speedup", str(speedup)]
    lat = {m: measure(engine_args, flat, 1, MODES[m]) for m in ("direct", "gateway")}
    thr = {m: measure(engine_args, work, concurrency, r) for m, r in MODES.items()}
    med = statistics.median
    rows = {
        "requests/s": {m: r.completed / r.wall_s for m, r in thr.items()},
        "output tokens/s": {m: r.output_tokens / r.wall_s for m, r in thr.items()},
        "p50 e2e s (loaded)": {m: med(r.e2e_s) for m, r in thr.items()},
        "p95 e2e s (loaded)": {m: r.p(r.e2e_s, 95) for m, r in thr.items()},
        "p50 e2e ms (one at a time)": {m: med(r.e2e_s) * 1000 for m, r in lat.items()},
        "p50 ttft ms (one at a time)": {m: med(r.ttft_s) * 1000 for m, r in lat.items()},
        "failed requests": {m: thr[m].failed + (lat[m].failed if m in lat else 0) for m in thr},
    }
    return {
        "speedup": speedup,
        "throughput_ratio": rows["requests/s"]["gateway"] / rows["requests/s"]["direct"],
        "added_p50_ms_per_streamed_request": rows["p50 e2e ms (one at a time)"]["gateway"] - rows["p50 e2e ms (one at a time)"]["direct"],
        "added_p50_ttft_ms": rows["p50 ttft ms (one at a time)"]["gateway"] - rows["p50 ttft ms (one at a time)"]["direct"],
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="synth:rate=3,duration=900,seed=0")
    ap.add_argument("--speedups", default="100,10", help="fake-engine virtual seconds per wall second, one run each")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4, help="rounds replayed per session")
    ap.add_argument("--max-output", type=int, default=256, help="cap on a round's output tokens")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--latency-requests", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="8 sessions, 2 rounds, 12 latency requests, speedup 100 only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.rounds, args.latency_requests, args.speedups = 8, 2, 12, "100"
    work = sessions(args.workload, args.sessions, args.rounds, args.max_output)
    words = [sum(len(m["content"].split()) for m in json.loads(b)["messages"]) for s in work for _, b in s]
    flat = [[b] for s in work for b in s][: args.latency_requests]
    results = [run(float(x), work, flat, args.concurrency) for x in args.speedups.split(",")]
    summary = {"workload": args.workload, "sessions": len(work), "rounds": args.rounds, "concurrency": args.concurrency,
               "prompt_words_mean": statistics.mean(words), "prompt_words_max": max(words), "max_output": args.max_output, "runs": results}
    if args.json:
        print(json.dumps(summary))
        return
    con = Console()
    con.print(f"{args.workload}: {len(work)} sessions x {args.rounds} rounds, prompts mean {summary['prompt_words_mean']:.0f} / "
              f"max {summary['prompt_words_max']} tokens, output <= {args.max_output}; 2 fake engines; {args.concurrency} concurrent "
              "sessions; direct and gateway both least-loaded", highlight=False)
    for res in results:
        table = Table("metric", *MODES, "gateway / direct", title=f"speedup {res['speedup']:g}")
        for k, row in res["rows"].items():
            a, b = row["direct"], row["gateway"]
            table.add_row(k, *(f"{row[m]:.4g}" if m in row else "-" for m in MODES), f"{b / a:.3f}" if a else "-")
        con.print(table)
        con.print(f"speedup {res['speedup']:g}: throughput ratio {res['throughput_ratio']:.3f} (goal >= 0.8); added p50 latency per "
                  f"streamed request {res['added_p50_ms_per_streamed_request']:.2f} ms (goal <= 2 ms), before the first token "
                  f"{res['added_p50_ttft_ms']:.2f} ms", highlight=False)


if __name__ == "__main__":
    main()
