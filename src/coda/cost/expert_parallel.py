"""A data-parallel group with expert parallelism (vLLM's ``--data-parallel-size N
--enable-expert-parallel`` on an MoE model): what one lockstep step of its ranks costs.

Each rank schedules its own batch and runs attention and the dense operators on it alone, with
the whole model's dense weights (a TP 1 rank's operators). The MoE layers synchronise the ranks:
every rank gathers all ranks' tokens (dispatch), runs its ``experts / ranks`` whole experts on the
pairs routed to them, and reduce-scatters the results back (combine), so the group steps in
lockstep and its slowest rank sets the step. Routing is taken as uniform: each rank computes a
``1 / ranks`` share of the group's routed pairs and touches that share of the distinct experts.

vLLM pads the ranks' steps to one size when they run CUDA graphs (``coordinate_batch_across_dp``
in ``vllm/v1/worker/dp_utils.py``: the ranks agree on their token counts by an all-reduce each step,
and when the cudagraph mode they agree on, the least of theirs, is not NONE, every rank runs the
largest count). A step runs under CUDA graphs when its tokens fit the largest captured size, so
when every rank's step does, each rank's dense operators run on the largest rank's token count and
the dispatch gathers ``ranks x`` that count, an idle rank's dummy batch padded too; one larger step
turns graphs off for the group and nothing is padded. The padding tokens are real work in the dense
operators and in the dispatch and combine, not in attention (its metadata holds the real requests
only); in the MoE blocks they add routed pairs but no experts: padding tokens are alike and route
alike, so they touch the few experts of one token (``OperatorCost.moe_pairs_s``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coda.cost.operators import OperatorCost
from coda.cost.parallel import ExpertParallelComm
from coda.errors import CodaError

#: one rank's batch: its prefill chunks as (new, cached) tokens and its decodes' contexts
RankBatch = tuple[Sequence[tuple[int, int]], np.ndarray]

#: the most tokens a step may hold and still run under CUDA graphs: vLLM's default
#: ``max_cudagraph_capture_size``, min(2 x max_num_seqs, 512), at max_num_seqs >= 256 (cited: vLLM
#: source, ``CompilationConfig``); an engine started with ``--enforce-eager`` pads nothing
CUDAGRAPH_MAX_TOKENS = 512


class ExpertParallelGroup:
    """Step cost of the ranks of one data-parallel, expert-parallel group."""

    def __init__(self, cost: OperatorCost, ranks: int) -> None:
        p, g = cost.profile, cost.rank.g
        if not g.moe_layers or p.operators is None or p.operators.moe is None:
            raise CodaError(f"enable_expert_parallel: profile {p.name} describes no MoE block ({g.name} has no experts); drop it")
        if p.tp != 1:
            raise CodaError(f"enable_expert_parallel: profile {p.name} is a TP {p.tp} profile; a data-parallel rank needs a TP 1 profile")
        if g.num_experts % ranks:
            raise CodaError(f"data_parallel_size={ranks} does not divide {g.name}'s {g.num_experts} experts among the ranks")
        if p.gpu is None or p.gpu.link is None:
            raise CodaError(f"data_parallel_size={ranks}: profile {p.name} names no GPU link (gpu.link) for the dispatch and combine")
        self.cost = cost
        self.ranks = ranks
        self.comm = ExpertParallelComm(p.gpu.link, ranks, g.hidden_size, g.num_experts, g.activation_bytes)
        self.moe_layers = g.moe_layers

    def local_s(self, chunks: Sequence[tuple[int, int]], contexts: np.ndarray, padded_tokens: int = 0) -> float:
        """A rank's step without its MoE blocks: attention on its own batch, dense operators on its
        own tokens or on ``padded_tokens`` where that is more (DP padding, module docstring)."""
        tokens = len(contexts) + sum(n for n, _ in chunks)
        t = self.cost.step_s(chunks, contexts) - self.cost.moe_s(tokens)
        if padded_tokens > tokens:
            seqs = len(contexts) + len(chunks)
            t += self._dense(padded_tokens, seqs) - self._dense(tokens, seqs)
        return t

    def _dense(self, tokens: int, seqs: int) -> float:
        return self.cost.dense_s(tokens, seqs) - self.cost.moe_s(tokens)

    def padded_tokens(self, tokens: Sequence[int]) -> int:
        """The token count every rank runs when vLLM pads the group's step (0: no padding)."""
        return max(tokens) if 0 < max(tokens) <= CUDAGRAPH_MAX_TOKENS else 0

    def step_s(self, batches: Sequence[RankBatch]) -> float:
        """One lockstep step of the group given the batches of its busy ranks (idle ones wait, or
        run a dummy batch of the padded size where the step is padded)."""
        tokens = [len(ctx) + sum(n for n, _ in chunks) for chunks, ctx in batches]
        if sum(tokens) == 0:
            return 0.0
        pad = self.padded_tokens(tokens)
        routed = [pad] * self.ranks if pad else tokens
        slowest = max(self.local_s(chunks, ctx, pad) for chunks, ctx in batches)
        share = 1.0 / self.ranks
        moe = self.cost.moe_s(sum(tokens), share) + self.cost.moe_pairs_s(sum(routed) - sum(tokens), share)
        return slowest + moe + self.moe_layers * self.comm.layer_s(routed)
