"""A data-parallel group with expert parallelism (vLLM's ``--data-parallel-size N
--enable-expert-parallel`` on an MoE model): what one lockstep step of its ranks costs.

Each rank schedules its own batch and runs attention and the dense operators on it alone, with
the whole model's dense weights (a TP 1 rank's operators). The MoE layers synchronise the ranks:
every rank gathers all ranks' tokens (dispatch), runs its ``experts / ranks`` whole experts on the
pairs routed to them, and reduce-scatters the results back (combine), so the group steps in
lockstep and its slowest rank sets the step. Routing is taken as uniform: each rank computes a
``1 / ranks`` share of the group's routed pairs and touches that share of the distinct experts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coda.cost.operators import OperatorCost
from coda.cost.parallel import ExpertParallelComm
from coda.errors import CodaError

#: one rank's batch: its prefill chunks as (new, cached) tokens and its decodes' contexts
RankBatch = tuple[Sequence[tuple[int, int]], np.ndarray]


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

    def local_s(self, chunks: Sequence[tuple[int, int]], contexts: np.ndarray) -> float:
        """A rank's step without its MoE blocks: attention and dense operators on its own batch."""
        tokens = len(contexts) + sum(n for n, _ in chunks)
        return self.cost.step_s(chunks, contexts) - self.cost.moe_s(tokens)

    def step_s(self, batches: Sequence[RankBatch]) -> float:
        """One lockstep step of the group given the batches of its busy ranks (idle ones wait)."""
        tokens = [len(ctx) + sum(n for n, _ in chunks) for chunks, ctx in batches]
        total = sum(tokens)
        if total == 0:
            return 0.0
        slowest = max(self.local_s(chunks, ctx) for chunks, ctx in batches)
        return slowest + self.cost.moe_s(total, 1.0 / self.ranks) + self.moe_layers * self.comm.layer_s(tokens)
