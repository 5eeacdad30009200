"""The collectives of tensor and expert parallelism, counted as vLLM issues them and timed by
measured per-call costs (the profile's ``gpu.link``).

Which implementation runs (vLLM's ``CudaCommunicator.all_reduce``): the custom all-reduce
(``custom_all_reduce.py``) when the group has peer access and is two GPUs or NVLink-connected,
for messages below its ``max_size`` (8 MiB); NCCL otherwise. All-gather and reduce-scatter are
always NCCL (pynccl). One call costs ``floor + bus bytes / bus bandwidth`` with nccl-tests' bus
bytes, so the constants measured at one group size serve another.

Per step of a tensor-parallel rank (vLLM's model code): two all-reduces per layer of the step's
activations (the row-parallel ``o_proj`` after attention and ``down_proj`` after the MLP; an MoE
layer's final reduce takes ``down_proj``'s place), one after the vocabulary-parallel embedding,
and one all-gather of the sampled sequences' logits shards (``LogitsProcessor``).

Per MoE layer of an expert-parallel data-parallel group (vLLM's default all2all backend,
``allgather_reducescatter``): dispatch is an all-gather of every rank's hidden states and router
logits, combine a reduce-scatter of the hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

from coda.cost.profile import LinkSpec, Profile


def _bus_s(cost_floor: float, bus_bytes: float, bus_bw: float) -> float:
    return cost_floor + bus_bytes / bus_bw


def uses_custom_allreduce(nbytes: float, ranks: int, link: LinkSpec) -> bool:
    """vLLM's choice for one all-reduce (``should_custom_ar``)."""
    return link.custom_allreduce is not None and (ranks == 2 or link.kind == "nvlink") and nbytes < link.custom_max_bytes


def allreduce_s(nbytes: float, ranks: int, link: LinkSpec) -> float:
    """Seconds of one all-reduce of an ``nbytes`` message on each of ``ranks`` GPUs."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    cost = link.custom_allreduce if uses_custom_allreduce(nbytes, ranks, link) else link.nccl
    assert cost is not None
    return _bus_s(cost.floor_s, nbytes * 2 * (ranks - 1) / ranks, cost.bus_bw_bytes_s)


def allgather_s(total_bytes: float, ranks: int, link: LinkSpec) -> float:
    """Seconds of one NCCL all-gather (or reduce-scatter, the same bus bytes) whose gathered total is ``total_bytes``."""
    if ranks <= 1 or total_bytes <= 0:
        return 0.0
    return _bus_s(link.nccl.floor_s, total_bytes * (ranks - 1) / ranks, link.nccl.bus_bw_bytes_s)


@dataclass(frozen=True, slots=True)
class TensorParallelComm:
    """What one step of a tensor-parallel rank spends in collectives (see the module docstring)."""

    link: LinkSpec
    ranks: int
    layers: int
    hidden_size: int
    vocab_size: int  # 0: the logits gather is not counted (a model description without a vocabulary)
    activation_bytes: int = 2

    def step_s(self, tokens: int, sequences: int) -> float:
        if self.ranks <= 1 or tokens <= 0:
            return 0.0
        activations = tokens * self.hidden_size * self.activation_bytes
        t = (2 * self.layers + 1) * allreduce_s(activations, self.ranks, self.link)
        return t + allgather_s(sequences * self.vocab_size * self.activation_bytes, self.ranks, self.link)

    def terms(self, tokens: int, sequences: int) -> dict[str, float]:
        """The step's collectives by kind, in seconds (what ``coda profile show`` and the docs report)."""
        activations = tokens * self.hidden_size * self.activation_bytes
        one = allreduce_s(activations, self.ranks, self.link)
        return {"layer all-reduces": 2 * self.layers * one, "embedding all-reduce": one,
                "logits all-gather": allgather_s(sequences * self.vocab_size * self.activation_bytes, self.ranks, self.link)}


@dataclass(frozen=True, slots=True)
class ExpertParallelComm:
    """Dispatch and combine of one MoE layer across a data-parallel group with expert parallelism."""

    link: LinkSpec
    ranks: int
    hidden_size: int
    num_experts: int
    activation_bytes: int = 2

    def layer_s(self, tokens_per_rank: list[int] | tuple[int, ...]) -> float:
        total = sum(tokens_per_rank)
        if self.ranks <= 1 or total <= 0:
            return 0.0
        hidden = total * self.hidden_size * self.activation_bytes
        logits = total * self.num_experts * self.activation_bytes
        return allgather_s(hidden + logits, self.ranks, self.link) + allgather_s(hidden, self.ranks, self.link)


def tensor_parallel_comm(profile: Profile) -> TensorParallelComm | None:
    """A TP profile's collectives per step; ``None`` at TP 1 or where the profile states no link.
    A model description without a vocabulary (the analytic kinds) counts no logits gather."""
    link = profile.gpu.link if profile.gpu is not None else None
    if profile.tp <= 1 or link is None:
        return None
    if profile.geometry is not None:
        g = profile.geometry
        return TensorParallelComm(link, profile.tp, g.num_layers, g.hidden_size, g.vocab_size, g.activation_bytes)
    m = profile.model
    if m is None or m.hidden_size is None:
        return None
    return TensorParallelComm(link, profile.tp, m.num_layers, m.hidden_size, 0)
