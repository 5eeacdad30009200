"""Kernel-level attention time: CTAs in grid order, waves over SMs, shared HBM bandwidth.

Why mixed context lengths cost more than a uniform batch of the same total: a launch is a grid
of CTAs ("units"); at most ``slots`` (SMs x resident CTAs per SM) run at once and a unit starts
when a slot frees. Every running unit progresses at ``min(b, B / running)``: memory-bound work
shares the bandwidth ``B``, but one CTA cannot draw more than ``b`` (per-SM cap), so when only a
few long units are left the GPU idles and, as short units finish, the remaining ones speed up.
With ``m = B / b`` the time of a launch is exactly

    T = (W + (m - S)^+ tau_d + m rho_max - sum_top_m(rho)) / B

where ``W`` is the total work, ``tau_d`` the progress time at which the last unit is dispatched
and ``rho`` the work each unit still has then. ``rho`` is taken as a unit's size minus the work
dispatched after it divided by the slots (units drain in dispatch order); on the shared skew
measurements this fits as well as exact list scheduling (ratio MAE 0.020 for both).

Work is counted in token-heads (one KV head's K and V for one token). Two kernel families:

* ``fa2-split``: FlashAttention-2 split-KV decode as vLLM's fork runs it: one split count per
  launch from the longest sequence's block count (``num_splits_heuristic`` with twice the SM
  count, a single split once batch x KV heads fill 80% of that), GQA heads packed, each
  sequence's blocks divided among the splits; grid order is batch-fastest without splits and
  split-fastest (request-major) with them, plus a combine kernel. Mixed prefill+decode batches
  run the varlen kernel without splits and without GQA packing (``varlen_layer_s``).
* ``balanced``: FlashInfer-style equal-size work chunks over the total KV (every CTA carries the
  same work), plus a merge; skew costs almost nothing there.

Contexts passed in are sorted in descending order: the model assumes the engine lays out a
launch longest-first, which is what the shared measurements fit best (see docs/cost-model.md).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

FA2_MAX_SPLITS = 128
FA2_BLOCK_M = 64


@njit(cache=True)
def fa2_num_splits(batch_heads: int, sms2: int, n_blocks: int) -> int:
    """FlashAttention-2 ``num_splits_heuristic`` (flash_api.cpp, float32 as in C++), ``sms2`` = 2 x SMs."""
    if np.float32(batch_heads) >= np.float32(0.8) * np.float32(sms2):
        return 1
    max_splits = min(FA2_MAX_SPLITS, sms2, n_blocks)
    if max_splits <= 1:
        return 1
    eff = np.zeros(max_splits + 1, dtype=np.float32)
    best = np.float32(0.0)
    for s in range(1, max_splits + 1):
        if s > 1 and (n_blocks + s - 1) // s == (n_blocks + s - 2) // (s - 1):
            continue
        waves = np.float32(batch_heads * s) / np.float32(sms2)
        e = waves / np.float32(math.ceil(waves))
        eff[s] = e
        if e > best:
            best = e
    for s in range(1, max_splits + 1):
        if s > 1 and (n_blocks + s - 2) // (s - 1) == (n_blocks + s - 1) // s:
            continue
        if np.float64(eff[s]) >= 0.85 * np.float64(best):
            return s
    return 1


@njit(cache=True)
def _heap_push(heap: np.ndarray, size: int, cap: int, v: float) -> int:
    """Keep the ``cap`` largest values in a min-heap; returns the new size."""
    if size < cap:
        i = size
        heap[i] = v
        while i > 0:
            p = (i - 1) // 2
            if heap[p] <= heap[i]:
                break
            heap[p], heap[i] = heap[i], heap[p]
            i = p
        return size + 1
    if v <= heap[0]:
        return size
    heap[0] = v
    i = 0
    while True:
        lc = 2 * i + 1
        if lc >= size:
            break
        c = lc
        if lc + 1 < size and heap[lc + 1] < heap[lc]:
            c = lc + 1
        if heap[i] <= heap[c]:
            break
        heap[i], heap[c] = heap[c], heap[i]
        i = c
    return size


@njit(cache=True)
def _push_tail(heap: np.ndarray, size: int, cap: int, start: float, step: float, q: int) -> int:
    """Push a request's tail, ``start``, ``start - step``, ... (``q`` values), onto the bounded
    min-heap, stopping at the first value that can no longer enter it; the heap's new size."""
    for k in range(q):
        v = start - k * step
        if size == cap and v <= heap[0]:
            break
        size = _heap_push(heap, size, cap, v)
    return size


@njit(cache=True)
def _top_sum(heap: np.ndarray, size: int, m: float) -> float:
    """Sum of the top ``m`` (fractional) values kept in ``heap`` (capacity floor(m) + 1)."""
    k = int(m)
    total = 0.0
    smallest = np.inf
    for i in range(size):
        total += heap[i]
        smallest = min(smallest, heap[i])
    if size > k:  # the heap holds k + 1 values: drop part of the smallest
        total -= (1.0 - (m - k)) * smallest
    return total


# Packed constants (numba takes arrays cheaply): F_* index the float array, I_* the int array.
F_BW, F_RATE, F_CTA_WORK, F_LAUNCH, F_PER_REQ, F_COMBINE = range(6)
I_SLOTS, I_SMS2, I_KV_HEADS, I_Q_HEADS, I_BLOCK_N, I_FAMILY = range(6)
FAMILY_FA2, FAMILY_BALANCED = 0, 1


@njit(cache=True)
def _prepare(c_desc: np.ndarray, fp: np.ndarray, ip: np.ndarray) -> tuple:
    """Per-batch arrays shared by every cohort of the batch (contexts sorted descending).

    ``xw``: prefix sums of unit work without splits; ``phi[i]`` = w_i + xw[i+1] / slots, so
    that a cohort [a, e) without splits drains unit i's last round with residual
    ``phi[i] - xw[e] / slots``; ``order`` visits requests by descending ``phi``.
    """
    n = c_desc.shape[0]
    slots = ip[I_SLOTS]
    xw = np.zeros(n + 1)
    phi = np.empty(n)
    for i in range(n):
        xw[i + 1] = xw[i] + c_desc[i] + fp[F_CTA_WORK]
    for i in range(n):
        phi[i] = c_desc[i] + fp[F_CTA_WORK] + xw[i + 1] / slots
    order = np.argsort(-phi)
    return xw, phi, order


@njit(cache=True)
def _insert_desc(arr: np.ndarray, size: int, cap: int, v: float) -> int:
    """Keep the ``cap`` largest values sorted descending in ``arr``; returns the new size."""
    if size == cap:
        if v <= arr[size - 1]:
            return size
        size -= 1
    i = size
    while i > 0 and arr[i - 1] < v:
        arr[i] = arr[i - 1]
        i -= 1
    arr[i] = v
    return size + 1


@njit(cache=True)
def _union_top(top_phi: np.ndarray, size: int, theta: float, step: float, h: int, m: float, ptr: np.ndarray) -> tuple:
    """(rho_max, sum of the top m residuals) over rounds k < h, residual ``phi - theta - k step``.

    ``top_phi`` holds, sorted descending, the largest last-round ``phi`` of the cohort (at least
    floor(m) + 1 of them when there are that many): a request outside them cannot reach the top
    m in any round. The rounds are merged like sorted lists.
    """
    cap = int(m) + 1
    frac = m - int(m)
    if size == 0:
        return 0.0, 0.0
    rho_max = max(top_phi[0] - theta, 0.0)
    if size == cap and top_phi[0] - step <= top_phi[size - 1]:  # earlier rounds cannot reach the top m
        total = 0.0
        for j in range(size - 1):
            total += max(top_phi[j] - theta, 0.0)
        return rho_max, total + frac * max(top_phi[size - 1] - theta, 0.0)
    ptr[:h] = 0
    total = 0.0
    for taken in range(cap):
        best = 0.0
        kb = -1
        for k in range(h):
            if ptr[k] < size and (k == 0 or ptr[k] < ptr[k - 1]):
                v = top_phi[ptr[k]] - theta - k * step
                if v > best:
                    best = v
                    kb = k
        if kb < 0:
            break
        total += best if taken < cap - 1 else frac * best
        ptr[kb] += 1
    return rho_max, total


@njit(cache=True)
def _one_wave_round_major(xw: np.ndarray, a: int, e: int, h: int, m: float, heap: np.ndarray) -> float:
    """Drain term when every unit of cohort [a, e) runs in the first wave (no split)."""
    cap = int(m) + 1
    size = 0
    for i in range(a, e):
        wi = xw[i + 1] - xw[i]
        if size == cap and wi <= heap[0]:
            break
        for _ in range(h):
            size = _heap_push(heap, size, cap, wi)
    return m * (xw[a + 1] - xw[a]) - _top_sum(heap, size, m)


@njit(cache=True)
def _positive_residuals(phi: np.ndarray, a: int, e: int, theta: float, step: float, h: int) -> float:
    """Sum of all positive residuals at the drain (needed only when m exceeds the slots)."""
    total = 0.0
    for i in range(a, e):
        start = phi[i] - theta
        if start > 0.0:
            q = min(h, int(start / step) + 1)
            total += q * start - step * q * (q - 1) / 2.0
    return total


@njit(cache=True)
def _round_major_extra(phi, xw, a, e, top_phi, size, fp, ip, ptr) -> float:
    """Drain term of cohort [a, e) without splits given its largest last-round ``phi`` values."""
    h = ip[I_KV_HEADS]
    slots = ip[I_SLOTS]
    m = fp[F_BW] / fp[F_RATE]
    theta = xw[e] / slots
    step = (xw[e] - xw[a]) / slots
    rho_max, top = _union_top(top_phi, size, theta, step, h, m, ptr)
    extra = m * rho_max - top
    if m > slots:
        total = h * (xw[e] - xw[a])
        extra += (m - slots) * (total - _positive_residuals(phi, a, e, theta, step, h)) / slots
    return extra


@njit(cache=True)
def _drain_round_major(c_desc, xw, phi, order, a, e, fp, ip, heap) -> tuple:
    """(W, extra) for cohort [a, e) without splits: one unit per request and KV head, batch-fastest."""
    h = ip[I_KV_HEADS]
    m = fp[F_BW] / fp[F_RATE]
    total = h * (xw[e] - xw[a])
    if (e - a) * h <= ip[I_SLOTS]:
        return total, _one_wave_round_major(xw, a, e, h, m, heap)
    cap = int(m) + 1
    top_phi = np.empty(cap)
    size = 0
    for j in range(order.shape[0]):
        i = order[j]
        if a <= i < e:
            top_phi[size] = phi[i]
            size += 1
            if size == cap:
                break
    return total, _round_major_extra(phi, xw, a, e, top_phi, size, fp, ip, np.zeros(h, dtype=np.int64))


@njit(cache=True)
def _drain_request_major(c_desc, a, e, s, fp, ip, heap) -> tuple:
    """(W, extra) for cohort [a, e) split ``s`` ways: each request's blocks cut into at most s
    equal splits (per sequence), its split x KV-head CTAs consecutive; empty splits exit at once
    and are not charged (a handful per request, overlapping the real ones)."""
    h = ip[I_KV_HEADS]
    slots = ip[I_SLOTS]
    bn = ip[I_BLOCK_N]
    c0 = fp[F_CTA_WORK]
    m = fp[F_BW] / fp[F_RATE]
    cap = int(m) + 1
    size = 0
    total = 0.0
    units = 0
    for i in range(a, e):
        nb = (c_desc[i] + bn - 1) // bn
        real = max(1, (nb + (nb + s - 1) // s - 1) // max(1, (nb + s - 1) // s))
        total += h * (c_desc[i] + real * c0)
        units += real * h
    if units <= slots:
        rho_max = 0.0
        for i in range(a, e):
            nb = (c_desc[i] + bn - 1) // bn
            real = max(1, (nb + (nb + s - 1) // s - 1) // max(1, (nb + s - 1) // s))
            wi = c_desc[i] / real + c0
            rho_max = max(rho_max, wi)
            for _ in range(real * h):
                if size == cap and wi <= heap[0]:
                    break
                size = _heap_push(heap, size, cap, wi)
        return total, m * rho_max - _top_sum(heap, size, m)
    after = 0.0
    rho_max = 0.0
    rho_sum = 0.0
    for i in range(e - 1, a - 1, -1):
        nb = (c_desc[i] + bn - 1) // bn
        real = max(1, (nb + (nb + s - 1) // s - 1) // max(1, (nb + s - 1) // s))
        wi = c_desc[i] / real + c0
        g = real * h
        start = wi - after / slots
        step = wi / slots
        after += g * wi
        if start <= 0.0:
            continue
        q = min(g, int(start / step) + 1)
        rho_sum += q * start - step * q * (q - 1) / 2.0
        rho_max = max(rho_max, start)
        size = _push_tail(heap, size, cap, start, step, q)
    extra = m * rho_max - _top_sum(heap, size, m) + max(m - slots, 0.0) * (total - rho_sum) / slots
    return total, extra


@njit(cache=True)
def _balanced_layer_s(c_desc, a, e, fp, ip) -> float:
    """FlashInfer-style balanced decode over cohort [a, e): the total KV is cut into equal chunks,
    one per slot and KV head, so every CTA carries the same work; a request cut into several
    chunks costs a CTA overhead per chunk and a merge launch follows."""
    h = ip[I_KV_HEADS]
    slots = ip[I_SLOTS]
    per_head = max(1, slots // h)
    total = 0.0
    for i in range(a, e):
        total += c_desc[i]
    chunk = max(1.0, math.ceil(total / per_head))
    chunks = 0
    for i in range(a, e):
        chunks += max(1, int(math.ceil(c_desc[i] / chunk)))
    work = h * (total + chunks * fp[F_CTA_WORK])
    t = fp[F_LAUNCH] + fp[F_PER_REQ] * (e - a) + work / min(fp[F_BW], slots * fp[F_RATE])
    if chunks > e - a:
        t += fp[F_COMBINE]
    return t


@njit(cache=True)
def _cohort_layer_s(c_desc, xw, phi, order, a, e, fp, ip, heap) -> float:
    """Seconds of one layer's decode attention launch over cohort [a, e) of a descending batch."""
    n = e - a
    if n <= 0:
        return 0.0
    if ip[I_FAMILY] == FAMILY_BALANCED:
        return _balanced_layer_s(c_desc, a, e, fp, ip)
    t = fp[F_LAUNCH] + fp[F_PER_REQ] * n
    n_blocks = (c_desc[a] + ip[I_BLOCK_N] - 1) // ip[I_BLOCK_N]
    s = fa2_num_splits(n * ip[I_KV_HEADS], ip[I_SMS2], n_blocks)
    if s == 1:
        total, extra = _drain_round_major(c_desc, xw, phi, order, a, e, fp, ip, heap)
    else:
        total, extra = _drain_request_major(c_desc, a, e, s, fp, ip, heap)
        t += fp[F_COMBINE]
    return t + (total + extra) / fp[F_BW]


@njit(cache=True)
def decode_layer_s(contexts: np.ndarray, fp: np.ndarray, ip: np.ndarray) -> float:
    """One layer of decode attention for a batch (any order; laid out longest first)."""
    c = np.sort(contexts)[::-1].copy()
    xw, phi, order = _prepare(c, fp, ip)
    heap = np.empty(int(fp[F_BW] / fp[F_RATE]) + 2)
    return _cohort_layer_s(c, xw, phi, order, 0, c.shape[0], fp, ip, heap)


@njit(cache=True)
def _sweep_side(c, xw, phi, order, ks, long_side, fp, ip, heap, out) -> None:
    """Times of the long cohorts [0, n-k) (or short cohorts [n-k, n)) for every k in ``ks``.

    Cohorts without splits reuse one running top-(floor(m)+1) list of ``phi`` grown over the
    prefix (or suffix), so the whole side costs O(n m + cuts x m x heads) at worst.
    """
    n = c.shape[0]
    h = ip[I_KV_HEADS]
    slots = ip[I_SLOTS]
    bn = ip[I_BLOCK_N]
    m = fp[F_BW] / fp[F_RATE]
    cap = int(m) + 1
    run = np.empty(cap)  # largest phi of the cohort so far, sorted descending
    ptr = np.zeros(h, dtype=np.int64)
    size = 0
    needs = n - ks if long_side else ks.copy()
    idx = np.argsort(needs)
    grown = 0  # requests pushed so far (from the front for long cohorts, from the back for short)
    for jj in range(ks.shape[0]):
        j = idx[jj]
        k = ks[j]
        a = 0 if long_side else n - k
        e = n - k if long_side else n
        need = e - a
        while grown < need:
            i = grown if long_side else n - 1 - grown
            size = _insert_desc(run, size, cap, phi[i])
            grown += 1
        if need <= 0:
            out[j] = 0.0
            continue
        nblocks = (c[a] + bn - 1) // bn
        s = fa2_num_splits(need * h, ip[I_SMS2], nblocks)
        if ip[I_FAMILY] != FAMILY_FA2 or s > 1 or need * h <= slots:
            out[j] = _cohort_layer_s(c, xw, phi, order, a, e, fp, ip, heap)
            continue
        extra = _round_major_extra(phi, xw, a, e, run, size, fp, ip, ptr)
        out[j] = fp[F_LAUNCH] + fp[F_PER_REQ] * need + (h * (xw[e] - xw[a]) + extra) / fp[F_BW]


@njit(cache=True)
def cohort_sweep_layer_s(contexts: np.ndarray, cuts: np.ndarray, fp: np.ndarray, ip: np.ndarray) -> tuple:
    """Full batch and, for each cut k, the k shortest and the rest as two launches (one layer)."""
    c = np.sort(contexts)[::-1].copy()
    n = c.shape[0]
    xw, phi, order = _prepare(c, fp, ip)
    heap = np.empty(int(fp[F_BW] / fp[F_RATE]) + 2)
    full = _cohort_layer_s(c, xw, phi, order, 0, n, fp, ip, heap)
    short = np.empty(cuts.shape[0])
    long = np.empty(cuts.shape[0])
    _sweep_side(c, xw, phi, order, cuts, True, fp, ip, heap, long)
    _sweep_side(c, xw, phi, order, cuts, False, fp, ip, heap, short)
    return full, short, long


@njit(cache=True)
def gain_sweep(
    contexts: np.ndarray, cuts: np.ndarray, fp: np.ndarray, ip: np.ndarray, lower: float, upper: float, allowance_layer_s: float
) -> tuple:
    """Predicted and conservative relative gains of each cut (the ``cut`` shortest form one cohort).

    Conservative: (full x (1 - lower) - (short + long) x (1 + upper) - allowance) / (full x (1 - lower)).
    """
    full, short, long = cohort_sweep_layer_s(contexts, cuts, fp, ip)
    pred = np.empty(cuts.shape[0])
    cons = np.empty(cuts.shape[0])
    full_lo = full * (1.0 - lower)
    for j in range(cuts.shape[0]):
        parts = short[j] + long[j]
        pred[j] = (full - parts) / full
        cons[j] = (full_lo - parts * (1.0 + upper) - allowance_layer_s) / full_lo
    return pred, cons


@njit(cache=True)
def varlen_layer_s(dec: np.ndarray, pre_new: np.ndarray, pre_cached: np.ndarray, fp: np.ndarray, ip: np.ndarray) -> float:
    """One layer of FA2 varlen attention over decodes plus prefill chunks (no split, no GQA packing).

    Grid (m-blocks of the longest query, batch, query heads), batch-fastest per query head; a
    decode has one real m-block, a chunk of ``new`` tokens over ``cached`` has ceil(new/64), the
    j-th covering ``cached + min(new, 64 (j+1))`` keys (causal); the other CTAs exit at once.
    The query heads of a GQA group read the same KV through L2, so bandwidth is shared per group.
    """
    slots = ip[I_SLOTS]
    hq = ip[I_Q_HEADS]
    c0 = fp[F_CTA_WORK]
    d = np.sort(dec)[::-1]
    nd = d.shape[0]
    npf = pre_new.shape[0]
    mmax = 1
    real = nd
    for p in range(npf):
        mb = (pre_new[p] + FA2_BLOCK_M - 1) // FA2_BLOCK_M
        real += mb
        mmax = max(mmax, mb)
    if real == 0:
        return 0.0
    w = np.empty(real)
    k = 0
    for i in range(nd):
        w[k] = d[i] + c0
        k += 1
    for p in range(npf):
        mb = (pre_new[p] + FA2_BLOCK_M - 1) // FA2_BLOCK_M
        for j in range(mb):
            w[k] = pre_cached[p] + min(pre_new[p], FA2_BLOCK_M * (j + 1)) + c0
            k += 1
    bw = fp[F_BW] * hq / ip[I_KV_HEADS]
    m = bw / fp[F_RATE]
    cap = int(m) + 1
    heap = np.empty(cap + 1)
    size = 0
    round_work = 0.0
    for i in range(real):
        round_work += w[i]
    total = hq * round_work
    empty = ((nd + npf) * mmax - real) * hq
    extra = 0.0
    if real * hq <= slots:
        rho_max = 0.0
        for i in range(real):
            rho_max = max(rho_max, w[i])
            for _ in range(hq):
                size = _heap_push(heap, size, cap, w[i])
        extra = m * rho_max - _top_sum(heap, size, m)
    else:
        step = round_work / slots
        suffix = round_work
        rho_max = 0.0
        rho_sum = 0.0
        for i in range(real):
            suffix -= w[i]
            start = w[i] - suffix / slots
            if start <= 0.0:
                continue
            q = min(hq, int(start / step) + 1)
            rho_sum += q * start - step * q * (q - 1) / 2.0
            rho_max = max(rho_max, start)
            size = _push_tail(heap, size, cap, start, step, q)
        extra = m * rho_max - _top_sum(heap, size, m) + max(m - slots, 0.0) * (total - rho_sum) / slots
    return fp[F_LAUNCH] + fp[F_PER_REQ] * (nd + npf) + (total + empty * c0 + extra) / bw


@njit(cache=True)
def decode_layers_s(flat: np.ndarray, offsets: np.ndarray, fp: np.ndarray, ip: np.ndarray) -> np.ndarray:
    """``decode_layer_s`` for many batches: batch j is ``flat[offsets[j]:offsets[j + 1]]``."""
    out = np.empty(offsets.shape[0] - 1)
    for j in range(out.shape[0]):
        out[j] = decode_layer_s(flat[offsets[j] : offsets[j + 1]], fp, ip)
    return out


@njit(cache=True)
def prefill_layers_s(new: np.ndarray, cached: np.ndarray, fp: np.ndarray, ip: np.ndarray) -> np.ndarray:
    """``varlen_layer_s`` of single prefill chunks (no decodes), one per entry."""
    out = np.empty(new.shape[0])
    none = np.empty(0, dtype=np.int64)
    for j in range(out.shape[0]):
        out[j] = varlen_layer_s(none, new[j : j + 1], cached[j : j + 1], fp, ip)
    return out
