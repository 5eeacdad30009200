"""Paper-shaped reports on a reduced preset: structure, calibration, shadow counts, figures."""

from __future__ import annotations

import json

import matplotlib.image
import numpy as np
import pytest

from coda.sim.config import SimConfig
from experiments.paper import PaperPreset, PaperWorkload, build_report, markdown, plots, run_preset


@pytest.fixture(scope="module")
def single():
    preset = PaperPreset(name="mini-single", workers=1, workloads=(PaperWorkload("M2", 12, 0.25),),
                         systems=("vllm", "cachewise", "coda"), duration_s=1200, warmup_s=300,
                         shadow_state="fewest_blocks", slo_targets=(("M2", "M2"),))
    base = SimConfig(system="vllm")
    runs = run_preset(preset, [0, 1], base)
    return preset, runs, build_report(preset, runs, base)


def test_report_has_means_intervals_and_ratio_of_sums_gains(single):
    preset, runs, rep = single
    cell = rep["cells"]["M2/cachewise"]["default"]
    assert cell["output_tps"]["n"] == 2 and cell["output_tps"]["ci95"] is not None
    sums = {s: sum(r.summary["output_tps"] for r in runs if r.system == s) for s in preset.systems}
    assert rep["gains"]["M2/cachewise"]["vllm"]["output_tps"] == pytest.approx(sums["cachewise"] / sums["vllm"])
    json.dumps(rep)  # serialisable


def test_calibrated_slo_gives_cachewise_the_papers_share(single):
    preset, runs, rep = single
    cal = rep["slo_calibrated"]
    target = 9.4 / 132.6  # the paper's CacheWise on M2: SLO tok/s over output tok/s
    assert cal["target_shares"] == {"M2": pytest.approx(target)}
    cw = [r for r in runs if r.system == "cachewise"]
    from experiments.paper import window_metrics

    share = sum(window_metrics(r, r.window, cal["ttft_s"], cal["tbt_s"])["slo_tps"] for r in cw) / sum(r.summary["output_tps"] for r in cw)
    assert share == pytest.approx(cal["shares"]["M2"], rel=1e-9)
    assert share == pytest.approx(target, abs=0.01)


def test_cachewise_is_printed_next_to_the_papers_numbers(single):
    _, runs, rep = single
    rows = {(r["workload"], r["metric"]): r for r in rep["paper_baseline"]}
    assert set(rows) == {("M2", m) for m in ("output_tps", "tbt_mean_s", "useful_per_output", "slo_tps")}
    out = rows[("M2", "output_tps")]
    assert out["paper"] == 132.6 and out["error"] == pytest.approx(out["sim"] / 132.6 - 1)
    assert out["sim"] == pytest.approx(sum(r.summary["output_tps"] for r in runs if r.system == "cachewise") / 2)
    md = markdown(rep)
    assert "CacheWise against the paper" in md and "| M2 | output_tps | 132.6 |" in md


def test_ten_minute_window_and_gain_grid(single):
    _, runs, rep = single
    assert rep["windows_s"] == {"primary": [300, 1200], "10min": [300, 900]}
    cw = [r for r in runs if r.system == "cachewise"]
    done = [[x for x in r.records if x["state"] == "completed" and 300 <= x["finish_s"] <= 900] for r in cw]
    short = rep["cells"]["M2/cachewise"]["window_10min"]
    assert short["output_tps"]["mean"] == pytest.approx(sum(sum(x["output_tokens"] for x in d) / 600 for d in done) / 2)
    # mean TBT pools every gap of the requests that arrived in the window: sum of decode times over sum of gaps
    ready = [[x for x in r.records if x["tbt_mean_s"] is not None and x["output_tokens"] > 1 and 300 <= x["ready_s"] <= 900] for r in cw]
    pooled = [sum(x["finish_s"] - x["first_token_s"] for x in d) / sum(x["output_tokens"] - 1 for x in d) for d in ready]
    assert short["tbt_mean_s"]["mean"] == pytest.approx(sum(pooled) / 2, rel=1e-6)
    grid = rep["slo_gain_grid"]
    assert grid["vs"] == "cachewise" and set(grid["ratios"]) == {"M2/vllm", "M2/coda"}
    assert len(grid["ratios"]["M2/vllm"]) == len(grid["tbt_s"]) and all(
        len(row) == len(grid["ttft_s"]) for row in grid["ratios"]["M2/vllm"]
    )


def test_shadow_differences_per_system(single):
    _, _, rep = single
    assert rep["cells"]["M2/cachewise"]["differs_from_fewest_blocks"] == 0.0  # the policy agrees with itself
    assert rep["cells"]["M2/vllm"]["differs_from_fewest_blocks"] > 0


def test_markdown_and_figures(single, tmp_path):
    preset, runs, rep = single
    md = markdown(rep)
    assert "| M2 | cachewise |" in md and "Calibrated SLO" in md and "would have admitted another request or none" in md
    paths = plots(preset, runs, rep, tmp_path)
    assert {p.name for p in paths} == {"latency_cdfs.png", "throughput.png"}
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path.name
        image = matplotlib.image.imread(path)  # raises on a truncated or malformed PNG
        height, width = image.shape[:2]
        assert 200 <= height <= 4000 and 200 <= width <= 6000, (path.name, image.shape)
        assert len(np.unique(image.reshape(height * width, -1), axis=0)) > 1, f"{path.name} is one flat colour"


def test_multi_report_records_routing_distance_against_smetric():
    preset = PaperPreset(
        name="mini-multi",
        workers=3,
        workloads=(PaperWorkload("Q", 5),),
        systems=("smetric", "coda"),
        duration_s=600,
        warmup_s=200,
        shadow_router="smetric",
    )
    base = SimConfig(system="vllm")
    runs = run_preset(preset, [0], base)
    rep = build_report(preset, runs, base)
    rv = rep["cells"]["Q/coda"]["routing_vs_smetric"]
    assert rv["decisions"] > 0 and 0 < rv["differs_frac"] < 1
    assert rv["mean_distance_coda"] is not None and rv["mean_distance_smetric"] is not None  # seed 0 has decisions that differ
    assert rv["mean_distance_coda"] < rv["mean_distance_smetric"]  # coda picks the closer decoders
    assert "routing_vs_smetric" not in rep["cells"]["Q/smetric"]


def test_paper_multi_16_is_paper_multi_on_four_nodes_of_four_at_four_times_the_load():
    from coda.sim.cluster import Simulation
    from experiments.paper import PRESETS

    multi, wide = PRESETS["paper-multi"], PRESETS["paper-multi-16"]
    assert wide.workers == 4 * multi.workers and wide.systems == multi.systems and wide.shadow_router == multi.shadow_router
    assert wide.slo_targets == multi.slo_targets
    assert [(w.label, w.rate) for w in wide.workloads] == [(w.label, 4 * w.rate) for w in multi.workloads]
    sim = Simulation(wide.workloads[0].build(0, 60.0), SimConfig(system="vllm", workers=wide.workers))
    assert [sum(w.dram is store for w in sim.workers) for store in sim.dram_stores] == [4, 4, 4, 4]
