"""Paper-shaped reports on a reduced preset: structure, calibration, shadow counts, figures."""

from __future__ import annotations

import json

import pytest

from coda.eval.paper import PaperPreset, PaperWorkload, build_report, markdown, plots, run_preset
from coda.sim.config import SimConfig


@pytest.fixture(scope="module")
def single():
    preset = PaperPreset(name="mini-single", workers=1, workloads=(PaperWorkload("M2", 12, 0.25),),
                         systems=("vllm", "cachewise", "coda"), duration_s=900, warmup_s=300,
                         shadow_state="fewest_blocks", calibrate_on=("cachewise", "M2"))
    base = SimConfig()
    runs = run_preset(preset, [0, 1], base)
    return preset, runs, build_report(preset, runs, base)


def test_report_has_means_intervals_and_ratio_of_sums_gains(single):
    preset, runs, rep = single
    cell = rep["cells"]["M2/cachewise"]["default"]
    assert cell["output_tps"]["n"] == 2 and cell["output_tps"]["ci95"] is not None
    sums = {s: sum(r.summary["output_tps"] for r in runs if r.system == s) for s in preset.systems}
    assert rep["gains"]["M2/cachewise"]["vllm"]["output_tps"] == pytest.approx(sums["cachewise"] / sums["vllm"])
    json.dumps(rep)  # serialisable


def test_calibrated_slo_puts_cachewise_at_seven_percent(single):
    preset, runs, rep = single
    cal = rep["slo_calibrated"]
    assert cal["tbt_s"] == 0.1 and 0 < cal["ttft_s"] < 5.0
    cw = [r for r in runs if r.system == "cachewise"]
    from coda.eval.paper import _slo_metrics

    share = sum(_slo_metrics(r, cal["ttft_s"], cal["tbt_s"])["slo_tps"] for r in cw) / sum(r.summary["output_tps"] for r in cw)
    assert share == pytest.approx(0.07, abs=0.01)


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
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_multi_report_records_routing_distance_against_smetric():
    preset = PaperPreset(name="mini-multi", workers=3, workloads=(PaperWorkload("Q", 5),), systems=("smetric", "coda"),
                         duration_s=600, warmup_s=200, shadow_router="smetric")
    base = SimConfig()
    runs = run_preset(preset, [0], base)
    rep = build_report(preset, runs, base)
    rv = rep["cells"]["Q/coda"]["routing_vs_smetric"]
    assert rv["decisions"] > 0 and 0 < rv["differs_frac"] < 1
    if rv["mean_distance_coda"] is not None:
        assert rv["mean_distance_coda"] <= rv["mean_distance_smetric"]  # coda picks the closer decoders
    assert "routing_vs_smetric" not in rep["cells"]["Q/smetric"]


def test_paper_multi_16_is_paper_multi_on_four_nodes_of_four_at_four_times_the_load():
    from coda.eval.paper import PRESETS
    from coda.sim.cluster import Simulation

    multi, wide = PRESETS["paper-multi"], PRESETS["paper-multi-16"]
    assert wide.workers == 4 * multi.workers and wide.systems == multi.systems and wide.shadow_router == multi.shadow_router
    assert [(w.label, w.rate) for w in wide.workloads] == [(w.label, 4 * w.rate) for w in multi.workloads]
    sim = Simulation(wide.workloads[0].build(0, 60.0), SimConfig(workers=wide.workers))
    assert [sum(w.dram is store for w in sim.workers) for store in sim.dram_stores] == [4, 4, 4, 4]
