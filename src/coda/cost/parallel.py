"""Tensor parallelism's cost: the all-reduce of a layer's activations across its ranks.

NCCL's own cost model (``src/graph/tuning.cc``): a ring all-reduce over ``p`` ranks takes
``base + 2 (p - 1) hop + bytes / algbw`` with ``algbw = busbw x p / (2 (p - 1))``; NCCL picks
the faster of its low-latency protocol (LL: a quarter of the bus bandwidth, short latencies)
and its bandwidth protocol (Simple). The latencies below are NCCL's published constants; the
bus bandwidth is the link's, from the profile (a datasheet figure).
"""

from __future__ import annotations

from coda.cost.profile import LinkSpec

#: NCCL ring latencies in seconds: base, then per hop on NVLink and on PCIe (tuning.cc, NCCL 2.x)
RING_LL = (3.6e-6, {"nvlink": 0.47e-6, "pcie": 1.0e-6})
RING_SIMPLE = (8.4e-6, {"nvlink": 3.4e-6, "pcie": 5.7e-6})
LL_BANDWIDTH_SHARE = 0.25  # tuning.cc: ring LL all-reduce runs at a quarter of the bus bandwidth


def allreduce_s(nbytes: float, ranks: int, link: LinkSpec) -> float:
    """Seconds of one ring all-reduce of ``nbytes`` per rank over ``ranks`` GPUs."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = 2 * (ranks - 1)
    algbw = link.bus_bw_bytes_s * ranks / steps
    ll = RING_LL[0] + steps * RING_LL[1][link.kind] + nbytes / (algbw * LL_BANDWIDTH_SHARE)
    simple = RING_SIMPLE[0] + steps * RING_SIMPLE[1][link.kind] + nbytes / algbw
    return min(ll, simple)
