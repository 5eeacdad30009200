"""The operator cost model: a step's time as the sum of its measured operators on one rank.

    step = engine step time
         + sum over layers of the dense operators at the step's tokens (MLP ops on dense layers)
         + the operators run once per step (embedding, final norm)
         + lm_head and sampler at the step's sequences
         + MoE layers x (fixed + per distinct expert touched + per routed token)
         + attention: the kernel model of the step's actual contexts, corrected toward the
           measured grid by a fitted residual of its regime (decode, prefill, mixed)
         + under TP, two all-reduces per layer over the profile's GPU link

Each operator is a fitted curve of the profile's ``operators`` section; counts beyond the
measured range are extrapolated along the last slope (``Profile.beyond_measured`` says when).
Every curve of a kind shares its knots, so a step sums them once (one interpolation per kind).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from coda.cost.attention import AttentionSteps, KernelAttention
from coda.cost.cohorts import CohortPlan, GainBounds
from coda.cost.geometry import GEMMS, Rank, expected_experts
from coda.cost.paired import CohortGains
from coda.cost.parallel import tensor_parallel_comm
from coda.cost.profile import Curve, Profile, Residual
from coda.errors import CodaError

MLP_OPS = ("gate_up_proj", "down_proj", "act_fn")


class Piecewise:
    """A sum of curves on common knots, evaluated with ``np.interp`` plus the last slope beyond."""

    def __init__(self, curves: Sequence[tuple[Curve, float]]) -> None:
        knots = {tuple(c.knots) for c, _ in curves}
        if len(knots) != 1:
            raise ValueError("curves summed into one must share their knots")
        self.x = np.array(curves[0][0].knots)
        self.y = sum((np.array(c.seconds) * w for c, w in curves), np.zeros(len(self.x)))
        self.slope = float((self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2]))
        self.last, self.y_last = float(self.x[-1]), float(self.y[-1])

    def __call__(self, n: float) -> float:
        if n <= 0:
            return 0.0
        if n > self.last:
            return self.y_last + (n - self.last) * self.slope
        return float(np.interp(n, self.x, self.y))


class Correction:
    """exp of a fitted ``Residual``: multilinear in the log2 of its axes, held at the edges.
    Plain floats: it runs once per simulated step."""

    def __init__(self, r: Residual) -> None:
        self.axes = [list(k) for k in r.axes]
        self.v = list(r.values)
        sizes = [len(k) for k in r.axes]
        self.strides = [int(np.prod(sizes[d + 1 :])) for d in range(len(sizes))]

    def __call__(self, *point: float) -> float:
        corners = [(0, 1.0)]
        for knots, stride, p in zip(self.axes, self.strides, point):
            lp = math.log2(p) if p > 1.0 else 0.0
            i = min(max(bisect.bisect_right(knots, lp) - 1, 0), len(knots) - 2)
            t = min(max((lp - knots[i]) / (knots[i + 1] - knots[i]), 0.0), 1.0)
            corners = [(at + i * stride, w * (1.0 - t)) for at, w in corners] + [(at + (i + 1) * stride, w * t) for at, w in corners]
        v = self.v
        return math.exp(sum(w * v[at] for at, w in corners))


class OperatorCost(AttentionSteps, CohortGains):
    """``CostModel`` of an ``operators`` profile (see the module docstring)."""

    def __init__(self, profile: Profile) -> None:
        ops, g, gpu, engine = profile.operators, profile.geometry, profile.gpu, profile.engine
        assert ops is not None and g is not None and gpu is not None and engine is not None  # the profile's kind guarantees them
        self.profile = profile
        self.tp = profile.tp
        self.rank = Rank(g, self.tp)
        missing = [op for op in (*GEMMS, "layernorm", "rotary_emb", "qk_norm", "act_fn") if self.rank.has(op) and op not in ops.layer]
        if missing:
            raise CodaError(f"profile {profile.name}: operators.layer lacks {', '.join(missing)}, which {g.name} runs")
        layered = []
        for op, curve in ops.layer.items():
            if not self.rank.has(op):
                continue
            layers = g.dense_layers if op in MLP_OPS else g.num_layers
            layered.append((curve, float(ops.layer_counts.get(op, 1) * layers)))
        self._tokens = Piecewise(layered + [(c, 1.0) for c in ops.step.values()])
        self._seqs = Piecewise([(c, 1.0) for c in ops.per_sequence.values()])
        self._moe = ops.moe
        self.kernel = KernelAttention(profile.name, gpu, ops.attention.kernel, layers=g.num_layers, q_heads=self.rank.q_heads,
                                    kv_heads=self.rank.kv_heads, head_dim=g.head_dim, kv_dtype_bytes=g.kv_dtype_bytes)
        self.corrections = {k: Correction(getattr(ops.attention, k)) for k in ("decode", "prefill", "mixed")}
        self.comm = tensor_parallel_comm(profile)
        self._engine = engine
        self._kv_tok = g.kv_bytes_per_token(self.tp)

    # --- the parts of a step ---------------------------------------------------------------
    def dense_s(self, tokens: int, sequences: int) -> float:
        """Every operator but attention (and the engine's own time) of a step."""
        if tokens <= 0:
            return 0.0
        t = self._tokens(tokens) + self._seqs(sequences) + self.moe_s(tokens)
        if self.comm is not None:
            t += self.comm.step_s(tokens, sequences)
        return t

    def moe_s(self, routed_tokens: float, expert_share: float = 1.0) -> float:
        """The step's MoE blocks on this rank when ``routed_tokens`` tokens reach them (routed
        uniformly) and the rank holds ``expert_share`` of the experts: 1 under tensor parallelism
        (each expert's width split), 1 / ranks under expert parallelism (whole experts, so the rank
        computes its share of every token's routed pairs)."""
        g, m = self.rank.g, self._moe
        if m is None or not g.moe_layers or routed_tokens <= 0:
            return 0.0
        touched = expected_experts(routed_tokens, g.num_experts, g.experts_per_token) * expert_share
        pairs = routed_tokens * g.experts_per_token * expert_share
        return g.moe_layers * (m.fixed_s + m.expert_s * touched + m.pair_s * pairs)

    def moe_pairs_s(self, tokens: float, expert_share: float = 1.0) -> float:
        """The per-routed-token term alone of ``moe_s``: tokens whose routing touches no further
        experts (padding tokens, which all route alike)."""
        g, m = self.rank.g, self._moe
        if m is None or not g.moe_layers or tokens <= 0:
            return 0.0
        return g.moe_layers * m.pair_s * tokens * g.experts_per_token * expert_share

    def decode_attention_s(self, contexts: np.ndarray) -> float:
        c = np.asarray(contexts, dtype=np.int64)
        if len(c) == 0:
            return 0.0
        return self.kernel.decode_s(c) * self.corrections["decode"](len(c), float(c.mean()))

    def varlen_attention_s(self, chunks: Sequence[tuple[int, int]], contexts: np.ndarray) -> float:
        new = sum(n for n, _ in chunks)
        kernel = self.kernel.varlen_s(chunks, contexts)
        if len(contexts):
            return kernel * self.corrections["mixed"](new, len(contexts), float(np.mean(contexts)))
        return kernel * self.corrections["prefill"](new, new + sum(c for _, c in chunks))

    # --- the protocol ----------------------------------------------------------------------
    @property
    def step_fixed_s(self) -> float:
        return self._engine.step_s

    def operators_s(self, tokens: int, sequences: int) -> float:
        return self.dense_s(tokens, sequences)

    def cohort_attention_s(self, contexts: np.ndarray, plan: CohortPlan) -> float:
        s = np.sort(np.asarray(contexts, dtype=np.int64))
        return self.decode_attention_s(s[: plan.cut]) + self.decode_attention_s(s[plan.cut :])

    def decode_steps_s(self, contexts: np.ndarray, k: int, plan: CohortPlan | None = None) -> np.ndarray:
        first = self.step_s((), contexts, plan)
        if k == 1:
            return np.array([first])
        # Linear between a run's first and last step (contexts grow by one token per step).
        return np.linspace(first, self.step_s((), contexts + (k - 1), plan), k)

    def request_s(self, prompt_tokens: int, running: int = 0) -> float:
        return self._engine.request_s

    def prefill_only_s(self, new: int, cached: int) -> float:
        return self.step_s([(new, cached)], ()) if new > 0 else 0.0

    def unpaired_gain_bounds(self, contexts: np.ndarray, cuts: np.ndarray | None, launch_allowance_s: float) -> GainBounds:
        return self.kernel.gain_bounds(contexts, cuts, launch_allowance_s)

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self._kv_tok

    def h2d_s(self, nbytes: float, outstanding_s: float = 0.0) -> float:
        assert self.profile.h2d is not None
        return self.profile.h2d.seconds(nbytes) + max(0.0, outstanding_s)

    def d2h_s(self, nbytes: float) -> float:
        assert self.profile.d2h is not None
        return self.profile.d2h.seconds(nbytes)

    def ssd_read_s(self, nbytes: float) -> float:
        assert self.profile.ssd_read is not None
        return self.profile.ssd_read.seconds(nbytes)
