"""The collectives of tensor and expert parallelism: vLLM's choice of all-reduce, the per-call
cost, and the collectives a step counts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.cost.parallel import ExpertParallelComm, TensorParallelComm, allgather_s, allreduce_s, uses_custom_allreduce
from coda.cost.profile import LinkSpec, load_profile
from coda.profiling import catalog

PCIE5, PCIE4, NVLINK = (LinkSpec.model_validate(catalog.LINKS[k]["spec"]) for k in ("pcie-gen5-p2p", "pcie-gen4-no-p2p", "nvlink4"))


def test_vllm_takes_its_custom_allreduce_only_where_it_does():
    assert uses_custom_allreduce(1 << 20, 2, PCIE5)  # two GPUs with peer access, below max_size
    assert not uses_custom_allreduce(8 << 20, 2, PCIE5)  # at max_size: NCCL
    assert not uses_custom_allreduce(1 << 20, 4, PCIE5)  # more than two PCIe GPUs: NCCL
    assert uses_custom_allreduce(1 << 20, 8, NVLINK)
    assert not uses_custom_allreduce(1 << 10, 2, PCIE4)  # no peer access: NCCL


def test_a_call_costs_its_floor_plus_its_bus_bytes():
    nbytes = 64 * 4096 * 2
    custom, nccl = PCIE5.custom_allreduce, PCIE5.nccl
    assert allreduce_s(nbytes, 2, PCIE5) == pytest.approx(custom.floor_s + nbytes / custom.bus_bw_bytes_s)
    big = 16 << 20
    assert allreduce_s(big, 2, PCIE5) == pytest.approx(nccl.floor_s + big / nccl.bus_bw_bytes_s)
    assert allreduce_s(big, 4, PCIE5) == pytest.approx(nccl.floor_s + big * 1.5 / nccl.bus_bw_bytes_s)
    assert allgather_s(big, 2, PCIE5) == pytest.approx(nccl.floor_s + big / 2 / nccl.bus_bw_bytes_s)


@given(st.floats(1, 1e9), st.integers(2, 16), st.sampled_from([PCIE4, PCIE5, NVLINK]))
def test_collectives_take_at_least_their_floor_and_nothing_on_one_gpu(nbytes, ranks, link):
    floors = [link.nccl.floor_s] + ([link.custom_allreduce.floor_s] if link.custom_allreduce else [])
    assert allreduce_s(nbytes, ranks, link) >= min(floors) > 0
    assert allgather_s(nbytes * 2, ranks, link) >= allgather_s(nbytes, ranks, link) >= link.nccl.floor_s
    assert allreduce_s(nbytes, 1, link) == allgather_s(nbytes, 1, link) == 0.0


def test_a_tp_step_counts_two_allreduces_a_layer_the_embedding_and_the_logits():
    comm = TensorParallelComm(PCIE5, 2, layers=32, hidden_size=4096, vocab_size=128256)
    one = allreduce_s(10 * 4096 * 2, 2, PCIE5)
    terms = comm.terms(10, 10)
    assert terms == pytest.approx({"layer all-reduces": 64 * one, "embedding all-reduce": one,
                                   "logits all-gather": allgather_s(10 * 128256 * 2, 2, PCIE5)})
    assert comm.step_s(10, 10) == pytest.approx(sum(terms.values()))
    assert TensorParallelComm(PCIE5, 1, 32, 4096, 128256).step_s(10, 10) == 0.0


def test_ep_dispatch_gathers_and_combine_scatters_every_ranks_tokens():
    ep = ExpertParallelComm(PCIE5, 2, hidden_size=2048, num_experts=128)
    hidden, logits = 300 * 2048 * 2, 300 * 128 * 2
    assert ep.layer_s([100, 200]) == pytest.approx(allgather_s(hidden + logits, 2, PCIE5) + allgather_s(hidden, 2, PCIE5))
    assert ep.layer_s([0, 0]) == 0.0


def test_shipped_tp2_profiles_charge_the_collectives_of_their_link():
    p = load_profile("rtxpro6000-llama31-8b-tp2")
    assert p.gpu.link.p2p and p.gpu.link.custom_allreduce is not None
    for key in ("gpu.link.nccl.floor_s", "gpu.link.nccl.bus_bw_bytes_s", "gpu.link.custom_allreduce.floor_s"):
        assert p.provenance[key].startswith("measured by others:")
    with pytest.raises(ValueError, match="needs p2p"):
        LinkSpec.model_validate({**catalog.LINKS["pcie-gen5-p2p"]["spec"], "p2p": False})


@pytest.mark.parametrize("name, link", [("rtx4090-llama31-8b", "pcie-gen4-no-p2p"), ("rtxpro6000-qwen3-30b-a3b-tp2", "pcie-gen5-p2p"),
                                        ("a100x8-qwen3-235b-a22b-fp8", "nvlink3")])
def test_shipped_profiles_carry_their_links_catalog_entry(name, link):
    p = load_profile(name)
    spec, prov = catalog.link_entry(link)
    assert p.gpu.link == LinkSpec.model_validate(spec)
    assert {k: p.provenance[k] for k in prov} == prov
