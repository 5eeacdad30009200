"""The simulator's default set leaves out a configuration whose mechanism its profile gives no
room to act, and says why; a named configuration still runs (``coda.bench.burst.inert_on``)."""

from __future__ import annotations

from coda.bench.burst import DEFAULT_CONFIGS, SIM_CONFIGS, inert_on, left_out
from coda.cost.profile import load_profile


def test_a_measured_profile_without_dram_or_cohort_gains_leaves_out_the_tiers_and_cohorts_configurations():
    inert = inert_on(load_profile("vllm-cpu-tiny-contended"))
    assert set(inert) == {"tiers", "cohorts"}
    dropped = left_out(tuple(c for c in DEFAULT_CONFIGS if c in SIM_CONFIGS), inert)
    # coda-tail keeps retention beside them, and coda is Tiered-Aging's own row
    assert set(dropped) == {"coda+tiers", "coda+cohorts"}
    assert "no DRAM store" in dropped["coda+tiers"] and "cohort gains" in dropped["coda+cohorts"]


def test_a_profile_with_a_dram_store_and_paired_cohort_gains_leaves_nothing_out():
    profile = load_profile("rtx4090-llama31-8b")  # operators, a DRAM store per node, a paired cohort_gain section
    assert profile.tiers.dram_kv_bytes > 0 and profile.cohort_gain is not None
    assert inert_on(profile) == {}
    assert left_out(DEFAULT_CONFIGS, {}) == {}
