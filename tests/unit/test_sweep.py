"""The sweep executor: results in the cells' order whatever runs them, failures reported after the
rest finish, finished cells stored under keys of their whole configuration and read back."""

from __future__ import annotations

import math

import pytest

from coda.sim.config import SimConfig
from coda.sim.run import compare_cells, variants
from coda.sweep import Cell, SweepFailed, SweepOptions, cell_key, run_cells
from coda.sweep.executor import normalized

SPEC = "synth:rate=1,duration=60,seed=0"


def square(x: int) -> dict:
    return {"x": x, "square": x * x, "pair": (x, x + 0.5)}


def cells(n: int, fail: set[int] = frozenset()) -> list[Cell]:
    def run(i: int) -> dict:
        if i in fail:
            raise ValueError(f"cell {i} cannot run")
        return square(i)

    return [Cell(f"cell {i}", {"i": i}, lambda i=i: run(i)) for i in range(n)]


@pytest.mark.parametrize("jobs", [1, 3])
def test_results_come_back_in_the_cells_order_as_json_values(jobs):
    got = run_cells(cells(7), SweepOptions(jobs=jobs, progress=False))
    assert got == [normalized(square(i)) for i in range(7)]
    assert got[2]["pair"] == [2, 2.5]  # as JSON reads it back: the same whether computed here or stored


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_cell_is_reported_with_its_config_and_error_and_the_rest_are_stored(tmp_path, jobs):
    with pytest.raises(SweepFailed) as err:
        run_cells(cells(5, fail={1, 3}), SweepOptions(jobs=jobs, store=tmp_path, progress=False))
    msg = str(err.value)
    assert err.value.exit_code == 1 and msg.startswith("2 of 5 cells failed")
    assert 'cell 1 ({"i":1}): ValueError: cell 1 cannot run' in msg and 'cell 3 ({"i":3})' in msg
    assert len(list(tmp_path.glob("*.json.gz"))) == 3
    ran = []
    fixed = [Cell(c.label, c.config, lambda c=c, i=i: ran.append(i) or square(i)) for i, c in enumerate(cells(5))]
    assert run_cells(fixed, SweepOptions(jobs=1, store=tmp_path, progress=False)) == [normalized(square(i)) for i in range(5)]
    assert ran == [1, 3]  # only the failed cells ran again


def test_an_interrupted_sweep_resumes_where_it_stopped_to_the_same_result(tmp_path):
    calls: list[int] = []
    stop = [True]

    def run(i: int) -> dict:
        if i == 3 and stop and stop.pop():
            raise KeyboardInterrupt  # the user stops the sweep while the fourth cell runs (once)
        calls.append(i)
        return square(i)

    sweep = [Cell(f"cell {i}", {"i": i}, lambda i=i: run(i)) for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        run_cells(sweep, SweepOptions(jobs=1, store=tmp_path, progress=False))
    assert calls == [0, 1, 2]
    assert run_cells(sweep, SweepOptions(jobs=1, store=tmp_path, progress=False)) == run_cells(sweep, SweepOptions(jobs=1, progress=False))
    assert calls == [0, 1, 2, 3, 4, 5] + list(range(6))  # the resumed run ran 3-5 only; the unstored one ran all six
    again = []
    assert run_cells([Cell(c.label, c.config, lambda: again.append(1)) for c in sweep], SweepOptions(jobs=1, store=tmp_path, resume=False,
                     progress=False)) == [None] * 6 and len(again) == 6  # --no-resume runs everything


def _keys(base: SimConfig, systems=("vllm", "coda"), seeds=(0, 1), spec: str = SPEC) -> list[str]:
    return [c.key for c in compare_cells(spec, variants(list(systems)), list(seeds), base)]


@pytest.mark.parametrize("override", [
    {"workers": 2}, {"slo": {"ttft_s": 2.0}}, {"chunk_tokens": 128}, {"warmup_s": 10.0}, {"max_num_seqs": 64},
    {"policies": {"router": "round_robin"}}, {"dram": False}, {"profile": "a100-qwen3coder30b-fp8-roofline"},
])
def test_every_field_that_changes_a_result_changes_the_cells_key(override):
    base = SimConfig()
    keys = _keys(base)
    assert keys == _keys(SimConfig()) and len(set(keys)) == 4  # stable, and one per system and seed
    assert not set(keys) & set(_keys(base.with_overrides(**override)))


def test_the_workload_the_seed_and_the_profile_content_are_in_the_key(tmp_path):
    from coda.cost.profile import profile_data
    from coda.shell import strict_json

    base = SimConfig()
    assert not set(_keys(base)) & set(_keys(base, spec="synth:rate=2,duration=60,seed=0"))
    assert _keys(base, seeds=(1,)) == _keys(base, seeds=(0, 1))[2:]
    data = profile_data(base.profile)
    path = tmp_path / "profile.json"
    path.write_text(strict_json.dumps(data))
    before = _keys(base.with_overrides(profile=str(path)))
    data["description"] = data.get("description", "") + " (edited)"
    path.write_text(strict_json.dumps(data))
    assert not set(before) & set(_keys(base.with_overrides(profile=str(path))))


def test_a_key_does_not_depend_on_key_order_and_json_nulls_are_one_value():
    assert cell_key({"a": 1, "b": [1, 2]}) == cell_key({"b": [1, 2], "a": 1})
    assert cell_key({"a": 1.0}) != cell_key({"a": 1.5})
    assert cell_key({"a": math.nan}) == cell_key({"a": None})  # JSON has no NaN: what the store can hold


def test_jobs_must_be_positive():
    with pytest.raises(Exception, match="--jobs must be at least 1"):
        SweepOptions(jobs=0)


def test_coda_s_version_and_source_are_in_the_key(monkeypatch):
    import coda.sweep.store as store

    before = cell_key({"a": 1})
    monkeypatch.setattr(store, "code_digest", lambda: "edited")
    edited = cell_key({"a": 1})
    monkeypatch.setattr(store, "__version__", "9.9.9")
    assert len({before, edited, cell_key({"a": 1})}) == 3
