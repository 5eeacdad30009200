"""Multi-worker evaluation and routing analysis (docs/evaluation.md, part 2).

    python -m experiments.routing [EXPERIMENT ...]     # default: all

  paper      Figure 11 / 12 / 14 / 16 and Table 2 shape: Q1-Q3 x vllm, smetric, cachewise, dynamo,
             coda, coda-route-only, coda-admit-only on 4 workers, gains with jackknife intervals,
             and the routing probe on every run (which rule decided, load spread, distances)
  router     the router alone, engine admission held fixed: smetric vs coda with FCFS engines
             (smetric vs coda-route-only) and with CacheWise engines (smetric+fb vs coda-route+fb),
             the coda router's load slack 0 / 1 / 2, and smetric vs coda-route-only under the FA2
             kernel-level model, where mixing context lengths in a batch costs attention time
  concentration  one-round requests (Azure code trace, sped up x1 / x8 / x16): every decision
             goes to the coda router's context rule; does it concentrate load?
  Table 2 distances come from the same RouteProbe (experiments/common.py): on every routing
  decision in the window, smetric is evaluated in shadow on the same snapshot.

Four workers sharing one DRAM store, seeds 0-4, warm-up 1,200 s of a 3,600 s arrival window
(the paper-multi preset's), profile a100-qwen3coder30b-fp8-roofline, default SLO (TTFT <= 5 s, mean TBT <= 0.1 s).
"""

from __future__ import annotations

import sys
from typing import Any

from experiments.common import (
    ROOT,
    SEEDS,
    col,
    describe_workload,
    fmt_ci,
    fmt_gain,
    md_table,
    mean_of,
    run_experiments,
    run_grid,
    save,
)

WORKERS = 4
FA2 = "a100-qwen3coder30b-fp8-fa2"
SYSTEMS = ["vllm", "smetric", "cachewise", "dynamo", "coda", "coda-route-only", "coda-admit-only"]


def multi_grid(cells: dict[str, tuple[str, str, dict[str, Any]]], name: str) -> dict[str, list[dict[str, Any]]]:
    """``run_grid`` on four workers with the routing probe: cells are (workload label, system, overrides)."""
    return run_grid({row: (label, system, {"workers": WORKERS, "probes": ("state", "step", "route"), **over}, None)
                     for row, (label, system, over) in cells.items()}, name)


def header(title: str, workloads: list[str], note: str = "") -> str:
    lines = [
        f"## {title}",
        "",
        f"Seeds {', '.join(map(str, SEEDS))}; {WORKERS} workers, one shared DRAM store; warm-up 1,200 s; " + note,
        "",
    ]
    lines += [f"- {describe_workload(w)}" for w in workloads]
    return "\n".join(lines) + "\n"


def route_rows(res: dict[str, list[dict[str, Any]]], names: list[str]) -> list[list[str]]:
    rows = []
    for n in names:
        rs = res[n]
        kinds: dict[str, float] = {}
        for r in rs:
            for k, v in r["route_probe"]["kinds"].items():
                kinds[k] = kinds.get(k, 0.0) + v / len(rs)
        shares = [r["worker_output_shares"][0] for r in rs]
        rows.append(
            [
                n,
                f"{mean_of(rs, 'route_probe.differs_from_smetric'):.1%}",
                _f(mean_of(rs, "route_probe.mean_distance_chosen")),
                _f(mean_of(rs, "route_probe.mean_distance_smetric")),
                fmt_ci(col(rs, "route_probe.mean_load_above_min"), 2),
                fmt_ci(col(rs, "route_probe.mean_load_spread"), 2),
                fmt_ci(col(rs, "route_probe.mean_kv_max_over_mean"), 2),
                fmt_ci(shares, 3),
                "; ".join(f"{k} {v:.1%}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])),
            ]
        )
    return rows


ROUTE_HEAD = [
    "cell",
    "decisions differing from smetric (shadow)",
    "mean distance, chosen (differing, both with decoders)",
    "same, smetric's choice",
    "chosen load - min load",
    "load spread (max - min requests)",
    "busiest / mean active KV",
    "largest worker share of output",
    "which coda rule would decide (coda router re-evaluated on the snapshot)",
]


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def exp_paper() -> str:
    wls = ["Q1", "Q2", "Q3"]
    cells = {f"{w}/{s}": (w, s, {}) for w in wls for s in SYSTEMS}
    res = multi_grid(cells, "paper_multi")
    save("paper_multi", res)
    out = [
        header("Figures 11 / 12 / 14 / 16 and Table 2 shape (paper-multi)", wls, "profile a100-qwen3coder30b-fp8-roofline; default SLO.")
    ]
    rows = []
    for w in wls:
        for s in SYSTEMS:
            rs = res[f"{w}/{s}"]
            rows.append(
                [
                    w,
                    s,
                    fmt_ci(col(rs, "output_tps")),
                    fmt_ci(col(rs, "request_tps"), 3),
                    fmt_ci(col(rs, "slo_tps")),
                    fmt_ci(col(rs, "ttft_p50_s"), 2),
                    fmt_ci(col(rs, "ttft_p95_s"), 2),
                    fmt_ci(col(rs, "tbt_p50_s"), 1, 1e3),
                    fmt_ci(col(rs, "tbt_p95_s"), 1, 1e3),
                    fmt_ci(col(rs, "e2e_p50_s"), 1),
                    fmt_ci(col(rs, "e2e_p95_s"), 1),
                    fmt_ci(col(rs, "reuse_hbm"), 3),
                    fmt_ci(col(rs, "reuse_store"), 3),
                    fmt_ci(col(rs, "decode_concurrency"), 2),
                ]
            )
    out.append(
        md_table(
            [
                "workload",
                "system",
                "output tok/s",
                "requests/s",
                "SLO tok/s",
                "TTFT p50 s",
                "TTFT p95 s",
                "TBT p50 ms",
                "TBT p95 ms",
                "E2E p50 s",
                "E2E p95 s",
                "HBM reuse",
                "store reuse",
                "decode conc. per worker",
            ],
            rows,
        )
    )
    out.append("\nGains of coda, ratio of sums over seeds [jackknife 95% interval]:\n")
    rows = []
    for w in wls:
        for ref in ["vllm", "smetric", "cachewise", "dynamo", "coda-route-only", "coda-admit-only"]:
            a, b = res[f"{w}/coda"], res[f"{w}/{ref}"]
            rows.append(
                [
                    w,
                    f"coda vs {ref}",
                    fmt_gain(col(a, "output_tps"), col(b, "output_tps")),
                    fmt_gain(col(a, "request_tps"), col(b, "request_tps")),
                    fmt_gain(col(a, "slo_tps"), col(b, "slo_tps")),
                ]
            )
        best = max((s for s in ["vllm", "smetric", "cachewise", "dynamo"]), key=lambda s: sum(col(res[f"{w}/{s}"], "output_tps")))
        bslo = max((s for s in ["vllm", "smetric", "cachewise", "dynamo"]), key=lambda s: sum(col(res[f"{w}/{s}"], "slo_tps")))
        rows.append([w, f"strongest baseline: output {best}, SLO {bslo}", "", "", ""])
    out.append(md_table(["workload", "comparison", "output", "requests", "SLO"], rows))
    out.append("\nAblation (Figure 14 shape), against smetric:\n")
    rows = []
    for w in wls:
        for s in ["coda-route-only", "coda-admit-only", "coda"]:
            a, b = res[f"{w}/{s}"], res[f"{w}/smetric"]
            rows.append([w, s, fmt_gain(col(a, "output_tps"), col(b, "output_tps")), fmt_gain(col(a, "slo_tps"), col(b, "slo_tps"))])
    out.append(md_table(["workload", "system", "output vs smetric", "SLO vs smetric"], rows))
    out.append("\nRouting probe (Table 2 shape and load concentration):\n")
    out.append(md_table(ROUTE_HEAD, route_rows(res, [f"{w}/{s}" for w in wls for s in SYSTEMS])))
    return "\n".join(out)


def exp_router() -> str:
    wls = ["Q2", "Q3"]
    cells = {}
    for w in wls:
        cells[f"{w}/smetric"] = (w, "smetric", {})
        cells[f"{w}/coda-route-only"] = (w, "coda-route-only", {})
        cells[f"{w}/coda-route-only slack 0"] = (w, "coda-route-only", {"policies": {"router": {"params": {"load_slack": 0}}}})
        cells[f"{w}/coda-route-only slack 2"] = (w, "coda-route-only", {"policies": {"router": {"params": {"load_slack": 2}}}})
        cells[f"{w}/smetric+fb"] = (w, "smetric+fb", {})
        cells[f"{w}/coda-route+fb"] = (w, "coda-route+fb", {})
        cells[f"{w}/smetric, FA2 kernel model"] = (w, "smetric", {"profile": FA2})
        cells[f"{w}/coda-route-only, FA2 kernel model"] = (w, "coda-route-only", {"profile": FA2})
    res = multi_grid(cells, "router")
    save("router", res)

    def reference(k: str) -> str:
        w = k.split("/")[0]
        if k.endswith("+fb"):
            return f"{w}/smetric+fb"
        if k.endswith("FA2 kernel model"):
            return f"{w}/smetric, FA2 kernel model"
        return f"{w}/smetric"

    ref = {k: reference(k) for k in res}
    out = [
        header(
            "The router alone (engine admission fixed)",
            wls,
            "profile a100-qwen3coder30b-fp8-roofline unless the cell says 'FA2 kernel model' (a100-qwen3coder30b-fp8-fa2: batch "
            "composition changes attention time there, it does not in the analytic model); default SLO. smetric+fb / coda-route+fb = "
            "the router with CacheWise engines (fewest_blocks + tool-aware reclaim), experiment-only recombinations.",
        )
    ]
    rows = []
    for k, rs in res.items():
        b = res[ref[k]]
        rows.append(
            [
                k,
                fmt_ci(col(rs, "output_tps")),
                fmt_ci(col(rs, "slo_tps")),
                fmt_ci(col(rs, "ttft_p95_s"), 2),
                fmt_ci(col(rs, "reuse_hbm"), 3),
                fmt_ci(col(rs, "preemptions"), 0),
                "ref" if ref[k] == k else fmt_gain(col(rs, "output_tps"), col(b, "output_tps")),
                "ref" if ref[k] == k else fmt_gain(col(rs, "slo_tps"), col(b, "slo_tps")),
            ]
        )
    out.append(md_table(["cell", "output tok/s", "SLO tok/s", "TTFT p95 s", "HBM reuse", "preemptions", "gain output", "gain SLO"], rows))
    out.append("")
    out.append(md_table(ROUTE_HEAD, route_rows(res, list(res))))
    return "\n".join(out)


AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_code.csv"


def _speedup(wl: Any, factor: float) -> Any:
    """An open-loop trace replayed ``factor`` times faster (timestamps divided)."""
    from coda.workload.schema import Session, Workload
    from experiments.common import dataclasses_replace_round

    sessions = [
        Session(
            session_id=s.session_id,
            start_s=s.start_s / factor,
            prefix_group=s.prefix_group,
            tenant=s.tenant,
            rounds=[dataclasses_replace_round(r, at_s=None if r.at_s is None else r.at_s / factor) for r in s.rounds],
        )
        for s in wl.sessions
    ]
    return Workload(sessions=sessions, meta={**wl.meta, "speedup": factor}, block_tokens=wl.block_tokens)


#: the Azure code trace sped up as the concentration experiment replays it, by name
AZURE_SPEEDUPS = {"Azure code x1 (2.6 req/s)": 1.0, "Azure code x8 (20.5 req/s)": 8.0, "Azure code x16 (41 req/s)": 16.0}


def azure_replay(name: str, seed: int) -> Any:
    """The Azure code trace replayed ``AZURE_SPEEDUPS[name]`` times faster (the replay is deterministic: ``seed`` is unused)."""
    from coda.workload.spec import load_workload

    return _speedup(load_workload(str(AZURE)), AZURE_SPEEDUPS[name])


def exp_concentration() -> str:
    """Does the coda router concentrate load when affinity never decides? One-round requests
    (Azure code trace, no continuations), so every decision goes to the context rule."""
    cells = {}
    for v in AZURE_SPEEDUPS:
        wl = azure_replay(v, 0)
        warmup = max(r.at_s for sess in wl.sessions for r in sess.rounds) / 3
        for system in ("smetric", "coda-route-only"):
            cells[f"{v}/{system}"] = (v, system, {"workers": WORKERS, "probes": ("route",), "warmup_s": warmup}, None)
    res = run_grid(cells, "concentration", seeds=[0], build=azure_replay)
    save("concentration", res)
    out = [
        f"## Load concentration without affinity ({AZURE.name}, one-round requests)",
        "",
        f"{WORKERS} workers, FCFS engines, profile a100-qwen3coder30b-fp8-roofline, "
        "open-loop replay with timestamps divided by the speed-up; "
        "seed 0 (the replay is deterministic); warm-up = first third of the replay; default SLO.",
        "",
    ]
    rows = []
    for name, rs in res.items():
        r = rs[0]
        rp = r["route_probe"]
        rows.append(
            [
                name,
                f"{r['output_tps']:.1f}",
                f"{r['slo_tps']:.1f}",
                f"{r['ttft_p95_s']:.2f}",
                f"{rp['mean_load_above_min']:.2f}",
                f"{rp['mean_load_spread']:.2f}",
                f"{rp['mean_kv_max_over_mean']:.2f}",
                f"{r['worker_output_shares'][0]:.3f}",
                "; ".join(f"{k} {v:.1%}" for k, v in sorted(rp["kinds"].items(), key=lambda kv: -kv[1])),
            ]
        )
    out.append(
        md_table(
            [
                "cell",
                "output tok/s",
                "SLO tok/s",
                "TTFT p95 s",
                "chosen load - min load",
                "load spread (max - min requests)",
                "busiest / mean active KV",
                "largest worker share of output",
                "which coda rule decides",
            ],
            rows,
        )
    )
    return "\n".join(out)


EXPERIMENTS = {"paper": exp_paper, "router": exp_router, "concentration": exp_concentration}


if __name__ == "__main__":
    run_experiments(EXPERIMENTS, sys.argv[1:], "routing_")
