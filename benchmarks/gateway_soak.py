"""Gateway soak: ``--replicas`` (3) `coda serve` processes sharing a `redis-server` store, in front of
two `coda fake-engine` workers, all on loopback; agent sessions sent round-robin over the replicas
that are up (as a Service spreads them), at the knee, for ``--duration`` seconds, while one replica
is killed (SIGKILL: a crash, its streams cut mid-way) and restarted every ``--restart-every``
seconds, in turn.

Three phases, one command:

1. CPU cost: open-loop single-round requests (64-token prompts, 16 streamed tokens) at each of
   ``--cpu-rates`` req/s over the replicas; the replicas' CPU seconds (utime + stime from
   /proc/<pid>/stat) before and after, per completed request, give cores per 100 req/s (the
   replicas' idle cost included; it is printed alone too).
2. The knee: the synthetic agent workload in a closed loop of N sessions at a time (``coda bench
   --concurrency``: steady at once, where an arrival rate of long agent sessions takes longer to
   build up than a short ramp lasts), N in ``--ramp`` for ``--ramp-s`` seconds each. The knee is
   the smallest N whose request throughput is within 5% of the best (past it, more sessions add
   only waiting), or the highest N whose goodput is within 5% of the best (``coda bench``'s rule)
   where that is lower; the ramp stops at the first N past it. ``--concurrency`` skips the ramp.
3. The soak at the knee. Every HTTP attempt is logged with the replica (and which start of it)
   that served it. A 5xx or a cut stream is *on the killed replica's own streams* when that replica
   was killed while the attempt was in flight, else *elsewhere*; the check is zero elsewhere. An
   attempt the kill cut is sent once more on the next replica, as an agent retries its round. Each
   replica's RSS (VmRSS) is sampled every 5 s; the check is that no replica start that lived 3
   minutes grew more than 50 MiB from its first minute to its end (gateway_load.py's bound).

Exit status 1 when a check fails, with ``--strict`` only.

    python benchmarks/gateway_soak.py                 # 10 minutes, a restart every 2 minutes
    python benchmarks/gateway_soak.py --quick         # 60 s, a restart every 20 s, short phases 1 and 2
    python benchmarks/gateway_soak.py --store in-process --replicas 1   # no Redis: the harness alone
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from bench_gateway import cpu_s  # importing it puts the repository on sys.path, for the tests' Redis helper below
from bench_harness import open_loop
from gateway_load import rss_mib
from rich.console import Console
from rich.table import Table

from coda.bench.client import Attempt, Endpoint
from coda.bench.replay import BenchConfig, Replay
from coda.bench.report import knee
from coda.bench.run import summary_of
from coda.engines.launch import FakeEngineProcess
from coda.machine import machine, this_process
from coda.serving.procs import Proc, spawn
from coda.serving.redis_server import RedisServer, started
from coda.workload.schema import Workload
from coda.workload.spec import load_workload

RSS_PERIOD_S = 5.0  # assumed: often enough to see a trend over minutes, rare enough to cost nothing
RSS_LIVED_S = 180.0  # assumed: a replica start younger than this has no trend to judge
RSS_GROWTH_MIB = 50.0  # the bound gateway_load.py holds a gateway to, minute 1 to the end
KNEE_TOLERANCE = 0.05  # coda bench's knee rule: within 5% of the best
READY_TIMEOUT_S = 60.0  # assumed: a restarted replica answers /ready 200 well within this on loopback


@dataclass
class Replica:
    """One slot of the fleet; ``start`` counts its restarts (0: the first process)."""

    slot: int
    proc: Proc
    start: int = 0
    up: bool = True
    started_at: float = field(default_factory=time.perf_counter)


class Fleet:
    """The gateway replicas: started, killed and restarted by slot, each ready (``/ready`` 200) before it takes traffic."""

    def __init__(self, n: int, serve_args: list[str], env: dict[str, str]) -> None:
        self.serve_args = serve_args
        self.env = env
        self.replicas = [Replica(i, self._spawn()) for i in range(n)]
        self.killed: dict[tuple[int, int], float] = {}  # (slot, start) -> when it was killed (perf_counter)
        self.restart_s: list[float] = []  # kill to ready again, per restart

    def _spawn(self) -> Proc:
        proc = spawn("serve", "--port", "0", *self.serve_args, env=self.env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(proc.url + "/ready", timeout=2.0).status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        err = proc.stderr()
        proc.stop(signal.SIGKILL)
        raise RuntimeError(f"coda serve {' '.join(self.serve_args)} was not ready within {READY_TIMEOUT_S:g} s:\n{err[-2000:]}")

    async def restart(self, slot: int) -> None:
        """Take ``slot`` out of the rotation and kill it at once, then start it again and put it back once ready."""
        r = self.replicas[slot]
        r.up = False  # no await between this and the kill: no attempt is sent to it after
        killed_at = time.perf_counter()
        self.killed[(slot, r.start)] = killed_at
        r.proc.stop(signal.SIGKILL)
        r.proc = await asyncio.to_thread(self._spawn)
        r.start += 1
        r.started_at = time.perf_counter()
        r.up = True
        self.restart_s.append(r.started_at - killed_at)

    def stop(self) -> None:
        for r in self.replicas:
            r.proc.stop()


class Rotation(Endpoint):
    """Round-robin over the replicas that are up, one ``Endpoint`` per replica start; every attempt
    is logged with the (slot, start) that served it."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet.replicas[0].proc.url, model=None)
        self.fleet = fleet
        self.attempts: list[tuple[int, int, Attempt]] = []
        self._endpoints: dict[tuple[int, int], Endpoint] = {}
        self._turn = 0
        self.t0 = time.perf_counter()  # the origin of the times ``failures`` reports

    async def send(self, body: bytes, headers: dict[str, str], shard: int = 0, into: Attempt | None = None) -> Attempt:
        """One attempt on the next replica (filling ``into``); one cut by its replica's kill is sent again on the next, as
        an agent retries a round whose connection broke (so the load stays what the workload offers)."""
        key, a = await self._once(body, headers, shard, into)
        if not a.ok and key in self.fleet.killed:
            key, a = await self._once(body, headers, shard, None)
        return a

    async def _once(self, body: bytes, headers: dict[str, str], shard: int, into: Attempt | None) -> tuple[tuple[int, int], Attempt]:
        while not (up := [r for r in self.fleet.replicas if r.up]):
            await asyncio.sleep(0.05)  # one replica, restarting
        r = up[self._turn % len(up)]
        self._turn += 1
        key = (r.slot, r.start)
        if key not in self._endpoints:
            self._endpoints[key] = Endpoint(r.proc.url, model=self.model, shards=32, clock=self.clock)
        a = await self._endpoints[key].send(body, headers, shard, into)
        self.attempts.append((*key, a))
        return key, a

    async def close(self) -> None:
        for e in self._endpoints.values():
            await e.close()
        await super().close()


class RotatingReplay(Replay):
    """``coda bench``'s closed-loop replay, its requests spread by a ``Rotation``."""

    def __init__(self, workload: Workload, config: BenchConfig, rotation: Rotation) -> None:
        super().__init__(workload, config)
        self.rotation = rotation

    def endpoint(self, shards: int) -> Endpoint:
        return self.rotation


Background = Callable[[Replay], Awaitable[None]]


def replay(fleet: Fleet, workload: Workload, cfg: BenchConfig, spec: str, *background: Background) -> tuple[RotatingReplay, Rotation, dict]:
    """One replay through the fleet, with ``background(replay)`` coroutines beside it (cancelled at its end)."""
    rotation = Rotation(fleet)
    rep = RotatingReplay(workload, cfg, rotation)

    async def go() -> None:
        tasks = [asyncio.create_task(b(rep)) for b in background]
        try:
            await rep.run()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
    return rep, rotation, summary_of(rep, spec)


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    """Debian's redis-server on a free loopback port, nothing on disk (the tests' helper)."""
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server not found: apt-get install -y redis-server, or run with --store in-process", file=sys.stderr)
        sys.exit(2)
    with started(binary, "coda-soak-redis-") as server:
        yield server


# --- phase 1: CPU cost ----------------------------------------------------------------------
def cpu_cost(fleet: Fleet, rates: list[float], seconds: float, store_pid: int | None) -> list[dict]:
    """Per offered rate: the replicas' (and the store's) CPU seconds per second and per completed request, open loop."""
    rows = []
    for rate in rates:
        wl = open_loop(rate, seconds)
        pids = [r.proc.pid for r in fleet.replicas]
        before, t0 = sum(cpu_s(p) for p in pids), time.perf_counter()
        store_before = cpu_s(store_pid) if store_pid else 0.0
        _, _, s = replay(fleet, wl, BenchConfig(endpoint=fleet.replicas[0].proc.url, drain_s=30.0), f"open loop {rate:g} req/s")
        cpu, wall = sum(cpu_s(p) for p in pids) - before, time.perf_counter() - t0
        store = cpu_s(store_pid) - store_before if store_pid else None
        done = s["completed"]
        rows.append(
            {
                "offered_rps": rate,
                "completed": done,
                "failed": s["failed"],
                "rejected": s["rejected"],
                "wall_s": wall,
                "cpu_s": cpu,
                "cores": cpu / wall,
                "completed_rps": done / wall,
                "store_cores": store / wall if store is not None else None,
                "cores_per_100_rps": cpu / done * 100 if done else None,
            }
        )
    return rows


def idle_cores(fleet: Fleet, seconds: float) -> float:
    pids = [r.proc.pid for r in fleet.replicas]
    before = sum(cpu_s(p) for p in pids)
    time.sleep(seconds)
    return (sum(cpu_s(p) for p in pids) - before) / seconds


# --- phase 2: the knee ----------------------------------------------------------------------
def workload_spec(tokens: float, seed: int) -> str:
    """Sessions enough for any lane count here (64 req/s for an hour: some 2,800 sessions), in start order."""
    return f"synth:rate=64,duration=3600,seed={seed},tokens={tokens:g}"


def closed_loop(fleet: Fleet, concurrency: int, seconds: float, scale: float, warmup_s: float) -> BenchConfig:
    return BenchConfig(
        endpoint=fleet.replicas[0].proc.url,
        time_scale=scale,
        duration_s=seconds,
        warmup_s=warmup_s,
        drain_s=30.0,
        max_concurrency=concurrency,
    )


def ramp(fleet: Fleet, levels: list[int], seconds: float, scale: float, workload: Workload, spec: str) -> list[dict]:
    """Each concurrency in turn, until one's goodput falls 5% below the best so far (past the knee, the rest are only slower)."""
    rows: list[dict] = []
    for n in levels:
        _, _, s = replay(fleet, workload, closed_loop(fleet, n, seconds, scale, seconds / 3), spec)
        rows.append(
            {
                "concurrency": n,
                "goodput": s["goodput"],
                "completed": s["completed"],
                "failed": s["failed"],
                "rejected": s["rejected"],
                "ttft_p95_s": s["ttft_p95_s"],
                "request_tps": s["request_tps"],
            }
        )
        if ramp_knee(rows) != n:
            break
    return rows


def ramp_knee(rows: list[dict]) -> int:
    saturated = min(r["concurrency"] for r in rows if r["request_tps"] >= (1 - KNEE_TOLERANCE) * max(x["request_tps"] for x in rows))
    return min(saturated, int(knee(rows, "concurrency", KNEE_TOLERANCE) or saturated))


# --- phase 3: the soak ----------------------------------------------------------------------
def soak(
    fleet: Fleet, concurrency: int, duration: float, restart_every: float, scale: float, workload: Workload, spec: str
) -> tuple[dict, Rotation, list[tuple[float, int, int, float]]]:
    cfg = closed_loop(fleet, concurrency, duration, scale, min(60.0, duration / 3))
    rss: list[tuple[float, int, int, float]] = []  # (t, slot, start, MiB)
    t0 = time.perf_counter()

    async def restarts(rep: Replay) -> None:
        k = 0
        while (k + 1) * restart_every < duration:
            await asyncio.sleep(t0 + (k + 1) * restart_every - time.perf_counter())
            await fleet.restart(k % len(fleet.replicas))
            k += 1

    async def sample(rep: Replay) -> None:
        while True:
            for r in fleet.replicas:
                if r.up:
                    try:
                        rss.append((time.perf_counter() - t0, r.slot, r.start, rss_mib(r.proc.pid)))
                    except (OSError, RuntimeError):
                        pass  # it was killed between the check and the read
            await asyncio.sleep(RSS_PERIOD_S)

    _, rotation, summary = replay(fleet, workload, cfg, spec, restarts, sample)
    return summary, rotation, rss


def failures(rotation: Rotation, killed: dict[tuple[int, int], float]) -> dict:
    """5xx and cut streams (a 200 whose stream broke included) split by whether the replica serving them
    was killed while they were in flight."""
    own: Counter[str] = Counter()
    elsewhere: Counter[str] = Counter()
    rejected: Counter[int] = Counter()
    listed = []
    for slot, start, a in rotation.attempts:
        if a.ok:
            continue
        if a.status is not None and 400 <= a.status < 500:
            rejected[a.status] += 1
            continue
        reason = a.reason or f"http_{a.status}"
        kill = killed.get((slot, start))
        mine = kill is not None and a.end_s is not None and a.end_s >= kill
        (own if mine else elsewhere)[reason.split(":", 1)[0]] += 1
        listed.append(
            {
                "slot": slot,
                "start": start,
                "sent_s": a.sent_s - rotation.t0,
                "end_s": (a.end_s or 0.0) - rotation.t0,
                "tokens": a.tokens,
                "status": a.status,
                "reason": reason,
                "killed_replica": mine,
            }
        )
    served = Counter(slot for slot, _, _ in rotation.attempts)
    return {
        "attempts": len(rotation.attempts),
        "per_replica": dict(sorted(served.items())),
        "own": dict(own),
        "elsewhere": dict(elsewhere),
        "rejected_4xx": dict(rejected),
        "kills_s": {f"{s}.{k}": t - rotation.t0 for (s, k), t in killed.items()},
        "failed": listed,
    }


def rss_report(rss: list[tuple[float, int, int, float]]) -> tuple[list[dict], list[dict]]:
    """Per slot: the max and last RSS; per replica start that lived ``RSS_LIVED_S``: minute 1 to its end."""
    slots = []
    for slot in sorted({s for _, s, _, _ in rss}):
        mine = [m for _, s, _, m in rss if s == slot]
        slots.append({"slot": slot, "max_mib": max(mine), "last_mib": mine[-1], "samples": len(mine)})
    starts = []
    for key in sorted({(s, k) for _, s, k, _ in rss}):
        series = [(t, m) for t, s, k, m in rss if (s, k) == key]
        born = series[0][0]
        if series[-1][0] - born < RSS_LIVED_S:
            continue
        after = [m for t, m in series if t - born >= 60.0]
        starts.append(
            {
                "slot": key[0],
                "start": key[1],
                "lived_s": series[-1][0] - born,
                "min1_mib": after[0],
                "end_mib": after[-1],
                "growth_mib": after[-1] - after[0],
            }
        )
    return slots, starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--store", choices=("redis", "in-process"), default="redis", help="in-process: each replica alone (no Redis)")
    ap.add_argument("--duration", type=float, default=600.0, help="soak seconds (wall)")
    ap.add_argument("--restart-every", type=float, default=120.0, help="seconds between replica restarts")
    ap.add_argument("--quick", action="store_true", help="--duration 60 --restart-every 20, and short CPU and ramp phases")
    ap.add_argument("--speedup", type=float, default=10.0, help="fake engines' virtual seconds per wall second; the trace replays as fast")
    ap.add_argument("--tokens", type=float, default=0.1, help="the synthetic workload's token scale (1: the calibrated agent prompts)")
    ap.add_argument("--concurrency", type=int, help="the soak's sessions at a time instead of the ramp's knee")
    ap.add_argument("--ramp", default="4,8,16,32,64,128", help="sessions at a time of the ramp, rising")
    ap.add_argument("--ramp-s", type=float, default=30.0, help="wall seconds per ramp level")
    ap.add_argument("--cpu-rates", default="20,40", help="open-loop req/s of the CPU-cost phase ('' skips it)")
    ap.add_argument("--cpu-s", type=float, default=20.0, help="wall seconds per CPU-cost rate")
    ap.add_argument("--cpu-only", action="store_true", help="phase 1 alone: the CPU cost, then stop")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/gateway-soak"))
    ap.add_argument("--strict", action="store_true", help="exit 1 when a check fails")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.restart_every, args.ramp_s, args.cpu_s = 60.0, 20.0, 10.0, 5.0
    if args.replicas < 1 or args.duration <= 0 or args.restart_every <= 0 or not 0 < args.tokens <= 1:
        ap.error("--replicas >= 1, --duration > 0, --restart-every > 0 and 0 < --tokens <= 1")
    scale = 1.0 / args.speedup
    console = Console(width=160)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {**vars(args), "out": str(args.out), "machine": machine(**this_process()), "load_at_start": round(os.getloadavg()[0], 1)}

    with (
        FakeEngineProcess("--speedup", str(args.speedup)) as e0,
        FakeEngineProcess("--speedup", str(args.speedup)) as e1,
        redis_server() if args.store == "redis" else nullcontext() as store,
    ):
        env = {"CODA_SERVE_STORE__URL": store.url} if store else {}
        fleet = Fleet(args.replicas, ["--backend", e0.url, "--backend", e1.url, "--router", "coda"], env)
        try:
            idle = idle_cores(fleet, 10.0 if not args.quick else 3.0)
            cpu_rows = cpu_cost(fleet, [float(r) for r in args.cpu_rates.split(",") if r], args.cpu_s, store.proc.pid if store else None)
            if args.cpu_only:
                console.print(f"configuration: {json.dumps(config)}", highlight=False)
                cpu_table(console, args, idle, cpu_rows)
                return
            spec = workload_spec(args.tokens, args.seed)
            workload = load_workload(spec)
            if args.concurrency:
                ramp_rows, level = [], args.concurrency
            else:
                ramp_rows = ramp(fleet, [int(n) for n in args.ramp.split(",")], args.ramp_s, scale, workload, spec)
                level = ramp_knee(ramp_rows)
            summary, rotation, rss = soak(fleet, level, args.duration, args.restart_every, scale, workload, spec)
            fails = failures(rotation, fleet.killed)
            restarts = list(fleet.restart_s)
        finally:
            fleet.stop()

    slots, starts = rss_report(rss)
    report(console, args, config, idle, cpu_rows, ramp_rows, level, summary, fails, restarts, slots, starts)


def cpu_table(console: Console, args: argparse.Namespace, idle: float, cpu_rows: list[dict]) -> None:
    console.print(f"idle: {idle * 100:.2f}% of a core for {args.replicas} replicas", highlight=False)
    if not cpu_rows:
        return
    t = Table(
        title=f"CPU cost of {args.replicas} gateway replicas (open loop, 64-token prompts, 16 streamed tokens, "
        f"fake engines x{args.speedup:g})"
    )
    for c in (
        "offered req/s",
        "completed req/s",
        "failed",
        "CPU cores (all replicas)",
        "cores per 100 req/s",
        "store (redis-server) cores",
    ):
        t.add_column(c, justify="right")
    for r in cpu_rows:
        per = r["cores_per_100_rps"]
        t.add_row(
            f"{r['offered_rps']:g}",
            f"{r['completed_rps']:.1f}",
            str(r["failed"] + r["rejected"]),
            f"{r['cores']:.3f}",
            f"{per:.3f}" if per is not None else "-",
            f"{r['store_cores']:.3f}" if r["store_cores"] is not None else "-",
        )
    console.print(t)
    console.print(
        "cores per 100 req/s: the replicas' CPU seconds over the run (idle included) per completed request, x 100", highlight=False
    )
    if len(cpu_rows) >= 2:  # a line through the first and last rate: what a request adds, and what traffic costs at any rate
        lo, hi = cpu_rows[0], cpu_rows[-1]
        slope = (hi["cores"] - lo["cores"]) / (hi["completed_rps"] - lo["completed_rps"])
        console.print(
            f"per request: {slope * 100:.3f} cores per 100 req/s more between {lo['completed_rps']:.1f} and "
            f"{hi['completed_rps']:.1f} req/s; "
            f"at no rate (the line's intercept) {lo['cores'] - slope * lo['completed_rps']:.3f} cores for {args.replicas} replicas "
            "under traffic (each scrapes every engine every telemetry.scrape_interval_s while busy)",
            highlight=False,
        )


def report(
    console: Console,
    args: argparse.Namespace,
    config: dict,
    idle: float,
    cpu_rows: list[dict],
    ramp_rows: list[dict],
    level: int,
    summary: dict,
    fails: dict,
    restarts: list[float],
    slots: list[dict],
    starts: list[dict],
) -> None:
    console.print(f"configuration: {json.dumps(config)}", highlight=False)
    cpu_table(console, args, idle, cpu_rows)
    if ramp_rows:
        console.print(
            "ramp (sessions at a time -> goodput, completed, req/s, TTFT p95): "
            + "; ".join(
                f"{r['concurrency']} -> {r['goodput']:.3f}, {r['completed']}, {r['request_tps']:.1f}, "
                f"{r['ttft_p95_s'] or float('nan'):.2f} s"
                for r in ramp_rows
            )
            + ("; the top level still gained: the knee may lie above it" if level == ramp_rows[-1]["concurrency"] else ""),
            highlight=False,
        )
    console.print(
        f"soak: {args.duration:g} s at {level} sessions at a time ({'the knee' if ramp_rows else '--concurrency'}), "
        f"{summary['request_tps']:.1f} req/s; a replica killed and restarted "
        f"every {args.restart_every:g} s ({len(restarts)} restarts, kill to ready {min(restarts, default=0):.1f}-"
        f"{max(restarts, default=0):.1f} s)",
        highlight=False,
    )
    console.print(
        f"requests in the measurement window (after {summary['config']['warmup_s']:g} s): offered {summary['offered']}, "
        f"completed {summary['completed']}, rejected {summary['rejected']}, failed {summary['failed']}, goodput {summary['goodput']:.3f}; "
        f"HTTP attempts over the whole run {fails['attempts']} (per replica slot {fails['per_replica']}); "
        f"4xx {fails['rejected_4xx'] or 0}",
        highlight=False,
    )
    own, elsewhere = sum(fails["own"].values()), sum(fails["elsewhere"].values())
    console.print(
        f"5xx or cut streams: {own} on the killed replica's own streams {fails['own'] or ''}, {elsewhere} elsewhere "
        f"{fails['elsewhere'] or ''}",
        highlight=False,
    )
    t = Table(title=f"replica RSS (VmRSS every {RSS_PERIOD_S:g} s), per slot over its restarts")
    for c in ("slot", "samples", "max MiB", "last MiB"):
        t.add_column(c, justify="right")
    for s in slots:
        t.add_row(str(s["slot"]), str(s["samples"]), f"{s['max_mib']:.0f}", f"{s['last_mib']:.0f}")
    console.print(t)
    for s in starts:
        console.print(
            f"slot {s['slot']} start {s['start']} (lived {s['lived_s']:.0f} s): {s['min1_mib']:.0f} -> {s['end_mib']:.0f} MiB "
            f"({s['growth_mib']:+.1f}) from minute 1",
            highlight=False,
        )
    checks = {
        "zero 5xx elsewhere": elsewhere == 0,
        f"RSS growth <= {RSS_GROWTH_MIB:g} MiB per replica start that lived {RSS_LIVED_S:g} s": all(
            s["growth_mib"] <= RSS_GROWTH_MIB for s in starts
        ),
    }
    if not starts:
        console.print(f"RSS growth: not judged (no replica start lived {RSS_LIVED_S:g} s)", highlight=False)
    for name, ok in checks.items():
        console.print(f"check {name}: {'met' if ok else 'FAILED'}", highlight=False)
    (args.out / "soak.json").write_text(
        json.dumps(
            {
                "config": config,
                "idle_cores": idle,
                "cpu": cpu_rows,
                "ramp": ramp_rows,
                "concurrency": level,
                "summary": summary,
                "failures": fails,
                "restart_s": restarts,
                "rss_slots": slots,
                "rss_starts": starts,
                "checks": checks,
            },
            indent=2,
            default=str,
        )
    )
    console.print(f"wrote {args.out / 'soak.json'}", highlight=False)
    if args.strict and not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
