"""Gateway load test: find the knee with `coda bench --sweep`, run a quarter of the knee
(unloaded) and then ``--overload`` x the knee (default 4x) for ``--minutes`` per ingress policy,
each with its default thresholds (derived from the engines' limits), and report goodput, TTFT of
admitted requests against the unloaded run's, and the gateway's RSS.

Setup: two `coda fake-engine` workers (the paper's A100 profile, `--speedup`, ``--seats`` sequences
each), `coda serve` in front of them with the `coda` router, told their seats, `coda bench`
replaying the synthetic agent workload through the gateway. Checks printed at the end: the gateway
stays up; p95 TTFT of admitted (completed) requests with a shedding policy is within 2x of the
unloaded p95; its RSS grows by <= 50 MiB from minute 1 to the end and stays within 20 MiB from minute
2 to the end; goodput is printed beside
SLO-meeting output tokens per second, since the two can disagree in a closed loop: a session slowed
by overload offers fewer rounds, a shed one is charged the rounds it would have sent. A policy whose
run fails (`coda bench` exits non-zero, or the gateway does not start) is a row with its reason, and
the next policy runs.

Goodput and session goodput divide by the symmetric denominator of ``coda.metrics.offered`` (a
refused session's unsent rounds charged only as far as its trace timing at the unloaded pace
reaches inside the window, as a slowed session's late rounds are not; docs/bench.md),
beside ``coda bench``'s own goodput over the rounds the replay recorded (``goodput``); the symmetric
measures are named ``goodput_symmetric`` and ``slo_rps_symmetric`` here as everywhere.
Each row carries the ingress policy's liveness verdict (whether each gate fired) read from the
gateway's /metrics, and what says whether the door wasted capacity or overfilled an engine: the
seconds a worker sat idle while the door held requests, the refusals made while a worker was idle,
and the most requests in flight on one worker beside its seats (``--seats``, each fake engine's
``--max-num-seqs``, which the gateway is told). ``--json`` prints one object, ``{"rows": [...]}``, one row per phase and policy.

    python benchmarks/gateway_load.py [--speedup 5] [--minutes 10] [--overload 4] [--rates 0.5,1,2,4] [--out runs/gateway-load]
                                      [--sweep-json runs/gateway-load/sweep/sweep.json | --knee RATE]
                                      [--policies admit_all,queue_limit,session] [--gateway-config FILE] [--json]

Without ``--policies`` it runs ``admit_all``, every registered ingress policy (Coda's doors, and
admitperf's as ``admitperf_kv_threshold`` and ``admitperf_queue_depth`` when installed) and
``vllm-router``, each row named by its policy.

``--gateway-config`` is a `coda serve --config` file every gateway of the run starts with (for
example ``telemetry: {stale: saturated}``); the title names it. The policy ``vllm-router`` runs
the peer router instead of `coda serve`, with its concurrency limit set to the engines' seats
(``--max-concurrent-requests``, a queue of ``--peer-queue`` requests held up to ``--peer-queue-timeout-s``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from coda.config.load import read_config
from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.engines.launch import FakeEngineProcess
from coda.errors import CodaError
from coda.metrics.offered import symmetric_summary
from coda.metrics.requests import Window
from coda.metrics.tasks import alone_times_s
from coda.policy.registry import names
from coda.serving.procs import running
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[1]
from coda.bench.doors import PEER, PEER_QUEUE, PEER_QUEUE_TIMEOUT_S, PEER_VERSION, door_metrics, peer_limit, peer_python, vllm_router


def every_door() -> list[str]:
    """What a run without ``--policies`` compares: ``admit_all``, every registered ingress policy
    (Coda's, and the peers' that are installed: admitperf's as ``admitperf_...``) and vllm-router."""
    return ["admit_all", *(n for n in names("ingress") if n != "admit_all"), PEER]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RunFailed(Exception):
    """One run that produced no summary; its message is the reason (the tail of the failing command's stderr)."""


def bench(endpoint: str, args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "coda.cli", "bench", "--endpoint", endpoint, "--out", str(out), "--json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:  # bench's own one-line reason, not a CalledProcessError traceback
        raise RunFailed(f"coda bench exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout)


@dataclass(frozen=True)
class Door:
    """What every run's traffic goes through: `coda serve` with an ingress policy, or the peer."""

    serve_args: list[str]
    engines: list[str]
    peer: Path | None  # the peer's Python (None: no peer in this run)
    peer_limits: list[str]
    seats: int  # each engine's --max-num-seqs, which the gateway is told

    @contextlib.contextmanager
    def open(self, policy: str, log: Path) -> Iterator[tuple[str, int, Callable[[], bool]]]:
        """(URL, process id, whether it is still up) of the door for ``policy``."""
        if policy == PEER:
            if self.peer is None:
                raise RunFailed(f"{PEER} is not installed")
            with vllm_router(self.peer, self.engines, log, self.peer_limits) as proxy:
                yield proxy.url, proxy.pid, lambda: Path(f"/proc/{proxy.pid}").exists()
            return
        with running("serve", "--port", "0", *self.serve_args, "--router", "coda", "--ingress", policy) as gw:
            yield gw.url, gw.pid, lambda: gw.popen.poll() is None


def policy_run(door: Door, phase: str, rate: float, policy: str, duration: float, scale: float, out: Path) -> dict:
    """One policy's loaded (or unloaded) run behind a fresh gateway (or the peer): its measures on
    the symmetric denominator, its bench summary's, and the door's RSS over time."""
    label = f"{phase}-{policy}"
    wl = f"synth:rate={rate:g},duration={duration:.0f},seed=11"
    out.mkdir(parents=True, exist_ok=True)
    with door.open(policy, out / f"{label}.log") as (url, pid, up):
        samples: list[tuple[float, float]] = []
        stop = threading.Event()
        t0 = time.monotonic()
        th = threading.Thread(target=sample_rss, args=(pid, samples, stop, t0), daemon=True)
        th.start()
        try:
            s = bench(url, ["--workload", wl, "--time-scale", str(scale), "--warmup-s", "60"], out / label)
        finally:
            stop.set()
        alive = up()
        counts = {**door_metrics(url), "seats": door.seats} if alive and policy != PEER else {}
    after_1 = [r for t, r in samples if t >= 60]
    after_2 = [r for t, r in samples if t >= 120]
    records = [json.loads(line) for line in (out / label / "requests.jsonl").read_text().splitlines()]
    workload = load_workload(wl)
    fair = symmetric_summary(records, workload, Window(*s["window_s"]), time_scale=scale, ttft_slo_s=s["config"]["slo"]["ttft_s"],
                             tbt_slo_s=s["config"]["slo"]["tbt_s"], alone_s=alone_ends(workload))
    ingress = s.get("ingress") or {}
    return {"phase": phase, "policy": policy, "rate": rate, **fair, "goodput": s["goodput"], "offered_replayed": s["offered"],
            "slo_tps": s["slo_tps"], "output_tps": s["output_tps"], "ttft_p95_s": s["ttft_p95_s"], "alive": alive,
            "liveness": ingress.get("liveness"), "verdict": ingress.get("verdict", []), **counts,
            "rss_min1_mib": after_1[0] if after_1 else None, "rss_end_mib": after_1[-1] if after_1 else None,
            "rss_growth_mib": after_1[-1] - after_1[0] if after_1 else None, "rss_min2_mib": after_2[0] if after_2 else None,
            "rss_growth_min2_mib": after_2[-1] - after_2[0] if after_2 else None, "rss_samples": samples, "error": None}


def alone_ends(workload) -> dict[str, list[float]]:
    """Each session's round ends alone on an idle fake engine, in trace seconds: its cost profile
    and engine settings are the simulator's defaults, as `coda fake-engine`'s are."""
    engine = SimConfig()
    cost = build_cost_model(load_profile(engine.profile))
    return {s.session_id: alone_times_s(s, cost, chunk_tokens=engine.chunk_tokens, max_num_batched_tokens=engine.max_num_batched_tokens,
                                        decode_run_max=engine.decode_run_max) for s in workload.sessions}


def gateway_config(given: dict, engines: list[str], seats: int, out: Path) -> Path:
    """The run's `coda serve --config` file: the ``--gateway-config`` settings ``given`` with the
    engines as its backends, each with its seats, as a user who follows examples/coda.yaml states them."""
    cfg = dict(given)
    cfg["backends"] = [{"url": url, "max_num_seqs": seats} for url in engines]
    path = out / "gateway.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def sample_rss(pid: int, samples: list[tuple[float, float]], stop: threading.Event, t0: float) -> None:
    while not stop.wait(10.0):
        with contextlib.suppress(OSError, RuntimeError):
            samples.append((time.monotonic() - t0, rss_mib(pid)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--speedup", type=float, default=5.0)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rates", default="0.5,1,2,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweep-duration", type=float, default=900.0, help="trace seconds of each sweep run")
    ap.add_argument("--out", default="runs/gateway-load")
    ap.add_argument("--sweep-json", type=Path, help="reuse the sweep.json of an earlier run instead of sweeping again")
    ap.add_argument("--knee", type=float, help="the knee rate (req/s), e.g. from an earlier sweep, instead of sweeping")
    ap.add_argument("--overload", type=float, default=4.0, help="the loaded runs' rate as a multiple of the knee")
    ap.add_argument("--policies", help="ingress policies of the loaded runs, comma-separated ('+' composes); "
                    "default: admit_all, every registered ingress policy and vllm-router")
    ap.add_argument("--load-repeats", type=int, default=1, help="runs of every phase and policy, interleaved; medians with ranges")
    ap.add_argument("--peer-venv", type=Path, default=ROOT / "runs" / "peers", help="where vllm-router's virtual environment is made")
    ap.add_argument("--peer-queue", type=int, default=PEER_QUEUE, help="vllm-router's --queue-size (its default)")
    ap.add_argument("--peer-queue-timeout-s", type=int, default=PEER_QUEUE_TIMEOUT_S,
                    help="vllm-router's --queue-timeout-secs (the gateway's defer wait)")
    ap.add_argument("--gateway-config", type=Path,
                    help="a `coda serve --config` file (YAML or TOML) for every gateway of the run (its backends are the run's engines)")
    ap.add_argument("--seats", type=int, default=SimConfig().max_num_seqs,
                    help="each fake engine's --max-num-seqs, given to the gateway as its backends' max_num_seqs")
    ap.add_argument("--json", action="store_true", help='print {"rows": [...]} (one row per phase and policy) instead of the table')
    args = ap.parse_args()
    if args.load_repeats < 1:
        ap.error(f"--load-repeats {args.load_repeats}: give 1 or more")
    if args.seats < 1:
        ap.error(f"--seats {args.seats}: give 1 or more")
    try:
        given = read_config(args.gateway_config, "--gateway-config") if args.gateway_config else {}
    except CodaError as err:
        ap.error(str(err))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scale = 1.0 / args.speedup  # replay the trace as fast as the engines simulate it
    console = Console(stderr=args.json)
    engine_args = ("--speedup", str(args.speedup), "--max-num-seqs", str(args.seats))
    with FakeEngineProcess(*engine_args) as e0, FakeEngineProcess(*engine_args) as e1:
        serve_args = ["--config", str(gateway_config(given, [e0.url, e1.url], args.seats, out))]
        policies = args.policies.split(",") if args.policies else every_door()
        peer = None
        if PEER in policies:
            try:
                peer = peer_python(PEER_VERSION, args.peer_venv / f"{PEER}-{PEER_VERSION}")
            except (OSError, subprocess.CalledProcessError) as err:  # its rows fail with the reason; the others run
                console.print(f"{PEER} {PEER_VERSION} cannot be installed, so its runs fail: {err}", highlight=False)
        peer_limits = peer_limit(2 * args.seats, args.peer_queue, args.peer_queue_timeout_s)
        door = Door(serve_args, [e0.url, e1.url], peer, peer_limits, args.seats)
        sweep_wl = f"synth:rate=1,duration={args.sweep_duration:g},seed=0"
        if args.knee:
            sweep = {"knee_rate": args.knee, "given": True}
        elif args.sweep_json:
            sweep = json.loads(args.sweep_json.read_text())
        else:
            try:  # everything after needs the knee
                with running("serve", "--port", "0", *serve_args, "--router", "coda", "--ingress", "admit_all") as gw:
                    sweep = bench(gw.url, ["--workload", sweep_wl, "--sweep", args.rates, "--repeats", str(args.repeats),
                                           "--time-scale", str(scale), "--warmup-s", str(args.sweep_duration / 3 * scale)], out / "sweep")
            except RunFailed as err:
                raise SystemExit(f"the sweep failed: {err}") from None
        knee = sweep.get("knee_rate")
        if knee is None:
            raise SystemExit(f"no knee found over rates {args.rates}: {json.dumps(sweep)[:500]}")
        duration = args.minutes * 60 / scale  # trace seconds that replay in `minutes` of wall time
        # repeats interleaved (every policy once, then again), so a drift of the host spreads over all of them
        phases = [("unloaded", knee / 4, "admit_all"), *(("overload", args.overload * knee, p) for p in policies)]
        runs = [(r, phase, rate, policy) for r in range(args.load_repeats) for phase, rate, policy in phases]
        rows = []
        for repeat, phase, rate, policy in runs:
            where = out / f"r{repeat}" if args.load_repeats > 1 else out
            try:
                rows.append({"repeat": repeat, **policy_run(door, phase, rate, policy, duration, scale, where)})
            except (RunFailed, RuntimeError) as err:  # RuntimeError: the gateway did not start (coda.serving.procs)
                console.print(f"{phase} {policy} at {rate:g} req/s failed, the next policy runs: {err}", highlight=False)
                rows.append({"repeat": repeat, "phase": phase, "policy": policy, "rate": rate, "error": str(err)})
        if all(r.get("error") for r in rows if r["phase"] == "unloaded"):
            raise SystemExit(f"every unloaded run failed, so nothing compares against it: {rows[0]['error']}")
    summary = medians(rows)
    (out / "load.json").write_text(json.dumps({"knee": knee, "sweep": sweep, "rows": rows, "medians": summary, "args": vars(args)},
                                              indent=2, default=str))
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if k != "rss_samples"} for r in rows], "medians": summary}, default=str))
        return
    report(console, rows, knee, args)
    if args.load_repeats > 1:
        report_medians(console, summary)


#: the gateway's RSS from minute 2 to the end stays within this of flat (minute 1 still fills pools and caches)
RSS_FLAT_MIB = 20.0
#: the measures whose medians over repeats the summary gives, with their range
MEDIAN_KEYS = ("goodput_symmetric", "session_goodput", "sessions_completed", "slo_rps_symmetric", "ttft_p95_s", "rss_growth_mib",
               "rss_growth_min2_mib")


def medians(rows: list[dict]) -> list[dict]:
    """Per phase and policy, over the repeats that produced a summary: each of ``MEDIAN_KEYS``'s
    median and its range (``[min, max]``), and how many repeats ran and failed."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["phase"], r["policy"]), []).append(r)
    out = []
    for (phase, policy), runs in groups.items():
        done = [r for r in runs if not r.get("error")]
        row: dict = {"phase": phase, "policy": policy, "repeats": len(done), "failed": len(runs) - len(done)}
        for key in MEDIAN_KEYS:
            values = sorted(r[key] for r in done if r.get(key) is not None)
            row[key] = statistics.median(values) if values else None
            row[key + "_range"] = [values[0], values[-1]] if values else None
        out.append(row)
    return out


def report_medians(console: Console, summary: list[dict]) -> None:
    """Medians over the repeats with their ranges, each policy beside admit_all's at the same load."""
    table = Table(title="medians over the repeats [min, max]")
    for c in ("phase", "policy", "repeats (failed)", *MEDIAN_KEYS):
        table.add_column(c, justify="right")
    for r in summary:
        cells = [f"{r[k]:.3g} [{r[k + '_range'][0]:.3g}, {r[k + '_range'][1]:.3g}]" if r[k] is not None else "-" for k in MEDIAN_KEYS]
        table.add_row(r["phase"], r["policy"], f"{r['repeats']} ({r['failed']})", *cells)
    console.print(table)


def report(console: Console, rows: list[dict], knee: float, args: argparse.Namespace) -> None:
    """The table, each policy against admit_all at the same load in the same repeat, and each liveness verdict."""
    unloaded_p95 = {r["repeat"]: r["ttft_p95_s"] or float("nan") for r in rows if r["phase"] == "unloaded" and not r.get("error")}
    bases = {r["repeat"]: r for r in rows if r["phase"] == "overload" and r["policy"] == "admit_all" and not r.get("error")}
    table = Table(
        title=f"gateway at {args.overload:g}x the knee ({knee:g} req/s; unloaded: {knee / 4:g} req/s), {args.minutes:g} min each, "
        f"fake engines x{args.speedup:g}, default thresholds, gateway config {args.gateway_config or 'none'}; "
        "offered: the symmetric denominator (docs/bench.md)"
    )
    cols = (
        "repeat",
        "phase",
        "policy",
        "rate",
        "offered",
        "admitted",
        "deferred",
        "rejected",
        "abandoned",
        "completed",
        "goodput (symmetric)",
        "session goodput",
        "sessions done",
        "goodput",
        "TTFT p95 (admitted)",
        "vs unloaded",
        "SLO req/s (symmetric)",
        "gateway up",
        "loop lag mean (>1 s)",
        "idle while held s (longest)",
        "refused while idle",
        "peak in flight / seats",
        "RSS min 1 -> end (MiB)",
        "RSS from min 2 (MiB)",
    )
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        if r.get("error"):
            cells = [str(r["repeat"]), r["phase"], r["policy"], f"{r['rate']:g}", f"failed: {r['error'][:200]}"]
            table.add_row(*cells, *["-"] * (len(cols) - len(cells)))
            continue
        p95 = r["ttft_p95_s"]
        unloaded = unloaded_p95.get(r["repeat"], float("nan"))
        table.add_row(
            str(r["repeat"]),
            r["phase"],
            r["policy"],
            f"{r['rate']:g}",
            *(str(r[k]) for k in ("offered", "admitted", "deferred", "rejected", "abandoned", "completed")),
            f"{r['goodput_symmetric']:.3f}",
            f"{r['session_goodput']:.3f}",
            f"{r['sessions_completed']}/{r['sessions_offered']}",
            f"{r['goodput']:.3f}",
            f"{p95:.2f} s" if p95 else "-",
            f"{p95 / unloaded:.2f}x" if p95 else "-",
            f"{r['slo_rps_symmetric']:.2f}",
            str(r["alive"]),
            f"{r['loop_lag_mean_s']:.3f} s ({r['loop_lag_over_1s']:.1%})" if "loop_lag_mean_s" in r else "-",
            f"{r['idle_while_held_s']:.1f} ({r['idle_while_held_longest_s']:.1f})" if "idle_while_held_s" in r else "-",
            str(r["refused_while_idle"]) if "refused_while_idle" in r else "-",
            f"{r['inflight_peak']} / {r['seats']}" if "inflight_peak" in r else "-",
            f"{r['rss_min1_mib']:.0f} -> {r['rss_end_mib']:.0f} ({r['rss_growth_mib']:+.1f})" if r["rss_end_mib"] else "-",
            f"{r['rss_growth_min2_mib']:+.1f}" if r.get("rss_growth_min2_mib") is not None else "-",
        )
    console.print(table)
    for r in rows:
        if r["phase"] == "unloaded":
            continue
        for line in r.get("verdict") or ():
            console.print(f"{r['policy']}: {line}", highlight=False)
        base = bases.get(r["repeat"])
        if r.get("error") or base is None or r is base:
            continue
        ratio = (r["ttft_p95_s"] or float("inf")) / unloaded_p95.get(r["repeat"], float("nan"))
        console.print(
            f"{r['policy']} at {args.overload:g}x: admitted TTFT p95 {ratio:.2f}x the unloaded p95 "
            f"({'met' if ratio <= 2 else 'MISSED'}, goal <= 2x); symmetric goodput {r['goodput_symmetric']:.3f} "
            f"(admit_all {base['goodput_symmetric']:.3f}); "
            f"session goodput {r['session_goodput']:.3f} (admit_all {base['session_goodput']:.3f}); sessions completed "
            f"{r['sessions_completed']} (admit_all {base['sessions_completed']})",
            highlight=False,
        )
        if r.get("rss_growth_min2_mib") is not None:
            flat = abs(r["rss_growth_min2_mib"]) <= RSS_FLAT_MIB
            console.print(f"{r['policy']} at {args.overload:g}x: gateway RSS {r['rss_growth_min2_mib']:+.1f} MiB from minute 2 to the end "
                          f"({'met' if flat else 'MISSED'}, goal within {RSS_FLAT_MIB:g} MiB)", highlight=False)


if __name__ == "__main__":
    main()
