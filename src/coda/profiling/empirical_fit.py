"""Fit the empirical step model (``coda.cost.empirical``) to timings measured through an API.

Two kinds of measurement constrain the six constants together:

* a prefill's latency = api_latency + api_id_token (token-id prompts: parsing) or api_text_token
  (text prompts: tokenization) x prompt tokens + step(one chunk of ``new`` over ``cached``);
* a lockstep decode batch's step = step(``batch`` decodes of mean context ``context``).

Prefills alone cannot tell the fixed step cost from the API latency, nor decodes alone the
per-token from the per-sequence cost; together they can. Least squares on relative error (every
shape counts alike, fast or slow), constants non-negative (exactly: the best of every subset of
free constants). The model's form is chosen from the data: each optional term (the quadratic
prefill pairs, the decode context) stays only if dropping it worsens the leave-one-out median
error (the worse of prefill's and decode's) by more than ``FORM_TOLERANCE``.
"""

from __future__ import annotations

import csv
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coda.cost.empirical import TERMS, pairs, step_features
from coda.profiling.api_measure import ApiSample, DecodeSample, EngineInfo, HostSample, PrefillSample

COLUMNS = ("api_latency_s", "api_id_token_s", "api_text_token_s", *TERMS)
OPTIONAL = ("prefill_pair_s", "decode_context_s")
FORM_TOLERANCE = 0.005  # absolute leave-one-out median error a term must save to stay


@dataclass(frozen=True, slots=True)
class StepFitResult:
    constants: dict[str, float]
    form: tuple[str, ...]  # the columns kept
    prefill_err: np.ndarray  # |predicted / measured - 1| per prefill sample
    decode_err: np.ndarray
    loo_err: np.ndarray  # leave-one-out errors of the chosen form, all samples
    loo_score: float  # the worse of the prefill and decode leave-one-out median errors
    forms: dict[str, float]  # ``loo_score`` of each form tried

    def predict(self, x: np.ndarray) -> np.ndarray:
        return x @ np.array([self.constants[c] for c in COLUMNS])


def design(prefill: Sequence[PrefillSample], decode: Sequence[DecodeSample]) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows over ``COLUMNS``, measured seconds, and how many rows are prefills (they come first)."""
    rows = [np.concatenate(([1.0, 0.0 if s.text_tokens else s.new + s.cached, s.text_tokens], step_features([(s.new, s.cached)], ())))
            for s in prefill]
    rows += [np.concatenate(([0.0, 0.0, 0.0], step_features((), np.full(s.batch, s.context)))) for s in decode]
    y = np.array([s.seconds for s in prefill] + [s.seconds for s in decode])
    return np.array(rows), y, len(prefill)


def nnls_relative(x: np.ndarray, y: np.ndarray, allowed: Sequence[int]) -> np.ndarray:
    """Non-negative least squares of relative error over the ``allowed`` columns (exact subset search)."""
    a = x / y[:, None]
    b = np.ones(len(y))
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    best, best_sse = np.zeros(x.shape[1]), float(len(y))  # the all-zero solution
    for k in range(1, len(allowed) + 1):
        for cols in itertools.combinations(allowed, k):
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (sol < 0).any():
                continue
            sse = float(((a[:, cols] @ sol - b) ** 2).sum())
            if sse < best_sse - 1e-12:
                best_sse = sse
                best = np.zeros(x.shape[1])
                best[list(cols)] = sol
    return best / scale


def _loo(x: np.ndarray, y: np.ndarray, allowed: Sequence[int]) -> np.ndarray:
    keep = np.ones(len(y), dtype=bool)
    err = np.empty(len(y))
    for i in range(len(y)):
        keep[i] = False
        theta = nnls_relative(x[keep], y[keep], allowed)
        keep[i] = True
        err[i] = abs(x[i] @ theta / y[i] - 1.0)
    return err


def fit_step_model(prefill: Sequence[PrefillSample], decode: Sequence[DecodeSample]) -> StepFitResult:
    """Constants, the chosen form and its errors."""
    if len(prefill) < 3 or len(decode) < 3:
        raise ValueError(f"need at least 3 prefill and 3 decode shapes to fit, got {len(prefill)} and {len(decode)}")
    x, y, n_pre = design(prefill, decode)
    base = [i for i, c in enumerate(COLUMNS) if c not in OPTIONAL]
    forms: dict[str, float] = {}
    loo: dict[tuple[int, ...], np.ndarray] = {}
    score: dict[tuple[int, ...], float] = {}
    for k in range(len(OPTIONAL) + 1):
        for extra in itertools.combinations(OPTIONAL, k):
            cols = tuple(sorted(base + [COLUMNS.index(c) for c in extra]))
            loo[cols] = _loo(x, y, cols)
            # Both kinds must be explained: a median over all samples would hide the fewer decodes.
            score[cols] = forms["+".join(extra) or "linear"] = float(max(np.median(loo[cols][:n_pre]), np.median(loo[cols][n_pre:])))
    # The simplest form within the tolerance of the best one.
    best = min(score.values())
    chosen = min((cols for cols in loo if score[cols] <= best + FORM_TOLERANCE), key=lambda c: (len(c), score[c]))
    theta = nnls_relative(x, y, chosen)
    err = np.abs(x @ theta / y - 1.0)
    return StepFitResult(
        constants=dict(zip(COLUMNS, (float(t) for t in theta))),
        form=tuple(COLUMNS[i] for i in chosen),
        prefill_err=err[:n_pre],
        decode_err=err[n_pre:],
        loo_err=loo[chosen],
        loo_score=score[chosen],
        forms=forms,
    )


def fit_api_stream(api: Sequence[ApiSample]) -> tuple[float, float, str]:
    """How much the API server's time for a request grows per request streaming beside it: per
    request (``api_stream_s``) and per prompt token (``api_stream_token_s``, where probes of two
    sizes tell it apart). Least squares over the median of each (load, size):
    ``a + b x tokens + stream x load + stream_token x tokens x load``; the two load terms are
    non-negative (the best of the subsets that keep them so). With its provenance."""
    loads = sorted({a.streams for a in api})
    if len(loads) < 2:
        return 0.0, 0.0, "not measured: the endpoint exposes no engine timing (vLLM's request queue and prefill histograms at /metrics)"
    sizes = len({a.prompt_tokens for a in api}) > 1
    n = np.array([a.prompt_tokens for a in api], dtype=float)
    load = np.array([a.streams for a in api], dtype=float)
    y = np.array([a.seconds for a in api])
    best: tuple[float, float, float] = (np.inf, 0.0, 0.0)
    for keep in ((True, sizes), (True, False), (False, sizes), (False, False)):
        cols = [np.ones_like(n), n] if sizes else [np.ones_like(n)]
        cols += [load] if keep[0] else []
        cols += [n * load] if keep[1] else []
        coef = np.linalg.lstsq(np.stack(cols, axis=1), y, rcond=None)[0]
        extra = coef[2 if sizes else 1:]
        if (extra < 0).any():
            continue
        sse = float(np.sum((np.stack(cols, axis=1) @ coef - y) ** 2))
        per = list(extra)
        stream = per.pop(0) if keep[0] else 0.0
        token = per.pop(0) if keep[1] else 0.0
        if sse < best[0]:
            best = (sse, float(stream), float(token))
    medians = "; ".join(
        f"{a.streams} streaming, {a.prompt_tokens} tokens: {a.seconds * 1e3:.2f} ms"
        for a in sorted(api, key=lambda a: (a.prompt_tokens, a.streams))
    )
    return (
        best[1],
        best[2],
        (
            f"fitted: the API server's time for a text request (client TTFT less vLLM's queue and prefill time for it) "
            f"while others stream, medians {medians}; least squares, the load terms non-negative"
        ),
    )


HOST_TERMS = ("request_s", "prompt_token_s", "output_token_s", "step_s")


def fit_host(host: Sequence[HostSample], constants: dict[str, float]) -> tuple[dict[str, float], str] | None:
    """The host model's four CPU costs (``coda.cost.host``) from the host probes of an engine whose
    host work shares the forward pass's core, with their provenance; None without probes.

    * A streamed batch outlasts the same batch not streamed by the server's work per step and per
      streamed token: (streamed - not) / output = step_s + output_token_s x batch.
    * Requests sent beside a batch delay it by their host CPU plus their own prefill in its steps
      (the step model's marginal cost of a chunk, from ``constants``):
      delay - prefills = request_s x requests + prompt_token_s x their prompt tokens.

    Non-negative least squares in seconds, each kind on its own rows."""
    streamed = [h for h in host if h.streams]
    loaded = [h for h in host if not h.streams]
    if len({h.batch for h in streamed}) < 2 or len({h.words for h in loaded}) < 2:
        return None
    from scipy.optimize import nnls

    step = np.array([[1.0, h.batch] for h in streamed])
    per_step = np.array([(h.loaded_s - h.quiet_s) / h.output for h in streamed])
    (step_s, output_token_s), _ = nnls(step, per_step)
    c = constants

    def prefill_s(new: int, cached: int) -> float:
        return c["token_s"] * new + c["seq_s"] + c["prefill_pair_s"] * pairs(new, cached)

    arrivals = np.array([[len(h.arrivals), sum(n + m for n, m in h.arrivals)] for h in loaded], dtype=float)
    delay = np.array([h.loaded_s - h.quiet_s - sum(prefill_s(n, m) for n, m in h.arrivals) for h in loaded])
    (request_s, prompt_token_s), _ = nnls(arrivals, delay)
    batches = sorted({h.batch for h in host})
    note = (
        f"fitted: host probes through the API, {len(streamed)} streamed against not streamed and {len(loaded)} with text requests "
        f"of {sorted({h.words for h in loaded})} words sent back to back beside them ({int(arrivals[:, 0].sum())} requests), "
        f"over lockstep decode batches of {batches} requests of {host[0].output} tokens; non-negative least squares in seconds"
    )
    values = dict(zip(HOST_TERMS, (float(request_s), float(prompt_token_s), float(output_token_s), float(step_s))))
    return values, note


def write_samples(path: Path, prefill: Sequence[PrefillSample], decode: Sequence[DecodeSample], api: Sequence[ApiSample] = ()) -> None:
    """Every repeat of every shape, the raw material of the fit."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("kind", "new", "cached", "text_tokens", "batch", "context", "repeat", "seconds"))
        for s in prefill:
            w.writerows(("prefill", s.new, s.cached, s.text_tokens, "", "", i, f"{t:.6g}") for i, t in enumerate(s.ttft_s))
        for d in decode:
            w.writerows(("decode", "", "", "", d.batch, f"{d.context:g}", i, f"{t:.6g}") for i, t in enumerate(d.step_s))
        for a in api:  # the batch column is the number of requests streaming beside the probe, new its prompt tokens
            w.writerows(("api", a.prompt_tokens, "", "", a.streams, "", i, f"{t:.6g}") for i, t in enumerate(a.api_s))


def write_host_samples(path: Path, host: Sequence[HostSample]) -> None:
    """Every host probe: its batch, whether streamed, its time alone and loaded, and the requests beside it."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("batch", "context", "output", "words", "streamed", "quiet_s", "loaded_s", "requests", "new_tokens", "cached_tokens"))
        for h in host:
            w.writerow((h.batch, h.context, h.output, h.words, int(h.streams), f"{h.quiet_s:.6g}", f"{h.loaded_s:.6g}", len(h.arrivals),
                        sum(n for n, _ in h.arrivals), sum(m for _, m in h.arrivals)))


def measured_profile(
    name: str,
    info: EngineInfo,
    prefill: Sequence[PrefillSample],
    decode: Sequence[DecodeSample],
    fit: StepFitResult,
    api: Sequence[ApiSample] = (),
    host: Sequence[HostSample] = (),
    *,
    kv_bytes_per_token: tuple[int, str],
    samples: str,
    date: str,
    machine: dict[str, Any] | None,
    note: str,
) -> dict[str, Any]:
    """A ``measured`` profile (JSON-ready) with the provenance of every constant. ``machine``: the
    engine's machine (``coda.machine``) when it ran where it was measured from, else
    ``None``. ``host``: probes of an engine whose host work shares the forward pass's core (its
    ``step_model.host`` section); none leaves the section out. The endpoint's address and the
    model's local path are not recorded."""
    if info.block_tokens is None or info.kv_capacity_tokens is None or info.max_model_len is None:
        raise ValueError("the engine did not report its block size, KV capacity and max_model_len")
    kv_tok, kv_source = kv_bytes_per_token
    engine = f"{served_model(info)} served by engine {info.version or '(version unknown)'}"
    src = (
        f"fitted: {len(prefill)} prefill and {len(decode)} decode shapes of {engine} measured through its API on {date}; "
        f"samples in {samples}"
    )
    metrics = "measured: vllm:cache_config_info at /metrics"
    c = fit.constants
    stream_s, stream_token_s, stream_note = fit_api_stream(api)
    step_model = {
        **{k: c[k] for k in COLUMNS},
        "api_stream_s": stream_s,
        "api_stream_token_s": stream_token_s,
        "kv_bytes_per_token": kv_tok,
        "block_tokens": info.block_tokens,
        "kv_capacity_tokens": info.kv_capacity_tokens,
        "max_model_len": info.max_model_len,
        "domain": {
            "prefill_tokens_max": max(s.new for s in prefill),
            "cached_tokens_max": max(s.cached for s in prefill),
            "decode_batch_max": max(d.batch for d in decode),
            "decode_context_max": int(max(d.context for d in decode)),
        },
        "fit": {
            "samples": len(prefill) + len(decode),
            "prefill_median_err": float(np.median(fit.prefill_err)),
            "prefill_max_err": float(fit.prefill_err.max()),
            "decode_median_err": float(np.median(fit.decode_err)),
            "decode_max_err": float(fit.decode_err.max()),
            "loo_err": fit.loo_score,
        },
    }
    host_fit = fit_host(host, c)
    if host_fit is not None:
        step_model["host"] = {**host_fit[0], "shares_cores": True}
    forms = ", ".join(f"{k} {v:.3f}" for k, v in fit.forms.items())
    prov = {f"step_model.{k}": src + (f"; form chosen by leave-one-out median error ({forms})" if k in OPTIONAL else "") for k in COLUMNS}
    prov |= {
        "step_model.api_stream_s": stream_note + (f"; samples in {samples}" if api else ""),
        "step_model.api_stream_token_s": stream_note + (f"; samples in {samples}" if api else ""),
        "step_model.kv_bytes_per_token": kv_source,
        "step_model.block_tokens": metrics + " block_size",
        "step_model.kv_capacity_tokens": metrics + " num_gpu_blocks x block_size",
        "step_model.max_model_len": "measured: max_model_len in /v1/models",
        **{f"step_model.domain.{k}": "measured: the largest shape measured" for k in step_model["domain"]},  # type: ignore[attr-defined]
        **{f"step_model.fit.{k}": "fitted: |predicted / measured - 1| over the fit's own samples" for k in step_model["fit"]},  # type: ignore[attr-defined]
        **{f"step_model.host.{k}": f"{host_fit[1]}; samples in {samples.removesuffix('.samples.csv')}.host.csv"
           for k in HOST_TERMS if host_fit is not None},
        "tiers.hbm_kv_bytes": "measured: kv_capacity_tokens x kv_bytes_per_token",
        "tiers.dram_kv_bytes": "measured: none; the profile describes one engine without KV offload",
        "tiers.ssd_kv_bytes": "measured: none; the profile describes one engine without KV offload",
        "tiers.workers_per_node": "measured: one engine",
    }
    host = "on the machine described in `machine`" if machine is not None else "from another machine (the engine's is not recorded)"
    return {
        "name": name,
        "description": f"Step costs of {engine}, measured through its OpenAI API on {date}, {host}. {note}".strip(),
        "kind": "measured",
        "tiers": {"hbm_kv_bytes": info.kv_capacity_tokens * kv_tok, "dram_kv_bytes": 0, "ssd_kv_bytes": 0, "workers_per_node": 1},
        "step_model": step_model,
        **({"machine": machine} if machine is not None else {}),
        "provenance": prov,
    }


def served_model(info: EngineInfo) -> str:
    """The served model's name, with its Hugging Face id when the engine reports one (a local
    path is left out: it names a folder of the machine, not the model)."""
    root = info.root
    if root is None or root == info.model or not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", root) or Path(root).exists():
        return info.model
    return f"{info.model} ({root})"
