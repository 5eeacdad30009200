import json

import numpy as np
import pytest

from coda.cost.model import AnalyticCost, CohortPlan
from coda.cost.profile import load_profile
from coda.errors import CodaError


@pytest.fixture(scope="module")
def cost():
    return AnalyticCost(load_profile())


def test_paper_profile_sizing():
    p = load_profile()
    assert p.model.kv_bytes_per_token == 96 * 1024
    tokens = p.tiers.hbm_kv_bytes / p.model.kv_bytes_per_token
    assert 365_000 < tokens < 375_000  # about 370K tokens in 33.91 GiB


def test_more_tokens_never_cheaper(cost):
    assert cost.step_s((), [1000] * 8) < cost.step_s((), [1000] * 9) < cost.step_s((), [2000] * 9)
    assert cost.prefill_only_s(1000, 0) < cost.prefill_only_s(2000, 0) < cost.prefill_only_s(2000, 5000)
    assert cost.h2d_s(1e6) < cost.h2d_s(1e8) < cost.h2d_s(1e10)


def test_weights_are_read_once_per_step(cost):
    mixed = cost.step_s([(512, 0)], [8000] * 8)
    separate = cost.step_s([(512, 0)], []) + cost.step_s((), [8000] * 8)
    assert mixed < separate
    # the shared part is exactly one step overhead + one weight read
    assert separate - mixed == pytest.approx(
        cost.profile.overheads.step_s + cost.dense_s(8) + cost.dense_s(512) - cost.dense_s(520), rel=1e-9
    )


def test_prefill_attention_is_quadratic(cost):
    small = cost.prefill_attention_s(1000, 0)
    big = cost.prefill_attention_s(8000, 0)
    assert big / small > 30  # 64x the pairs, minus fixed costs


def test_links_and_outstanding_transfers(cost):
    t = cost.h2d_s(2**30)
    assert cost.h2d_s(2**30, outstanding_s=0.5) == pytest.approx(t + 0.5)
    # beyond the last point the last slope continues (positive)
    slope = cost.h2d_s(2**32) - cost.h2d_s(2**31)
    assert slope > 0
    assert cost.h2d_s(3 * 2**31) - cost.h2d_s(2**32) == pytest.approx(slope, rel=1e-9)
    assert cost.ssd_read_s(2**30) > cost.h2d_s(2**30)


def test_linear_v0_predicts_no_cohort_gain(cost):
    ctx = np.array([1000, 1200, 30000, 40000])
    assert cost.step_s((), ctx, CohortPlan(cut=2)) > cost.step_s((), ctx)


def test_decode_runs_interpolate_exactly(cost):
    ctx = np.array([5000, 9000, 12000])
    run = cost.decode_steps_s(ctx, 50)
    assert run[0] == pytest.approx(cost.step_s((), ctx))
    assert run[-1] == pytest.approx(cost.step_s((), ctx + 49))
    assert run[17] == pytest.approx(cost.step_s((), ctx + 17))


def test_profile_needs_provenance_for_every_constant(tmp_path):
    from importlib import resources

    data = json.loads((resources.files("coda.cost") / "profiles" / "a100-qwen3coder30b-fp8-roofline.json").read_text())
    del data["provenance"]["gpu.num_sms"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CodaError, match="provenance missing for: gpu.num_sms"):
        load_profile(path)


def test_unknown_profile_lists_builtins():
    with pytest.raises(CodaError, match="a100-qwen3coder30b-fp8-roofline"):
        load_profile("h100-nonexistent")
