"""Measured attention CSVs (LLMServingSim's formats, ``coda profile measure``'s output) as batches.

Two formats, both one attention layer in microseconds:

* attention (base grid): ``prefill_chunk,kv_prefill,n_decode,kv_decode,time_us``: ``n_decode``
  decodes of context ``kv_decode`` plus an optional chunk of ``prefill_chunk`` new tokens over
  ``kv_prefill`` cached ones;
* skew: ``regime,n,nb,...,kvs,kv_big,kv_mean,t_mean_us,t_max_us,t_skew_us,...``: ``nb`` long
  (``kv_big``) and ``n - nb`` short (``kvs``) decodes, measured together (``t_skew_us``) and as
  uniform batches at the mean (``t_mean_us``) and long (``t_max_us``) context; ``mixed`` rows add
  a prefill chunk of ``pc`` tokens over ``kp``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coda.errors import CodaError, reading

ATTENTION_COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
SKEW_COLUMNS = ("regime", "n", "nb", "pc", "kp", "kvs", "kv_big", "kv_mean", "t_mean_us", "t_max_us", "t_skew_us")


@dataclass(frozen=True, slots=True)
class Batch:
    """One measured attention launch: decode contexts, prefill chunks and its time per layer."""

    regime: str  # "pure" (decode only), "mixed" (decodes + a prefill chunk), "prefill"
    role: str  # "grid" (attention file), "mean" / "max" / "skew" (skew file columns)
    decodes: np.ndarray
    prefill: tuple[tuple[int, int], ...]  # (new tokens, cached tokens)
    seconds: float
    line: int

    @property
    def batch(self) -> int:
        return len(self.decodes)

    @property
    def max_context(self) -> int:
        return int(self.decodes.max()) if len(self.decodes) else 0


@dataclass(frozen=True, slots=True)
class SkewRow:
    """A skew-file row: its three batches (uniform at the mean, uniform at the max, skewed)."""

    regime: str
    n: int
    nb: int
    kvs: int
    kv_big: int
    mean: Batch
    max: Batch
    skew: Batch


def _open(path: Path, columns: tuple[str, ...], kind: str) -> tuple[list[dict[str, str]], int]:
    if not path.exists():
        raise CodaError(f"{kind} CSV {path}: no such file (pass the path of a measured CSV)")
    with reading(path, f"{kind} CSV"), path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise CodaError(f"{kind} CSV {path}: missing column(s) {', '.join(missing)}; expected {','.join(columns)}")
        return list(reader), 2


def _num(path: Path, line: int, row: dict[str, str], col: str, kind: type = int) -> float:
    raw = row.get(col)
    try:
        value = kind(float(raw)) if kind is int else float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise CodaError(f"{path}:{line}: {col}: {raw!r} is not a number; fix or delete the row") from None
    if value < 0 or (kind is int and float(raw) != int(float(raw))):  # type: ignore[arg-type]
        raise CodaError(f"{path}:{line}: {col}: {raw!r} must be a non-negative {'integer' if kind is int else 'number'}")
    return value


def read_attention(path: Path) -> list[Batch]:
    """Batches of an attention (base-grid) CSV."""
    rows, first = _open(path, ATTENTION_COLUMNS, "attention")
    out: list[Batch] = []
    for k, row in enumerate(rows):
        line = first + k
        pc, kp, n, kv = (int(_num(path, line, row, c)) for c in ATTENTION_COLUMNS[:4])
        t = _num(path, line, row, "time_us", float)
        if t <= 0:
            raise CodaError(f"{path}:{line}: time_us: must be positive")
        if n == 0 and pc == 0:
            raise CodaError(f"{path}:{line}: an empty batch (n_decode = prefill_chunk = 0); delete the row")
        if n and kv == 0:
            raise CodaError(f"{path}:{line}: kv_decode: decodes need a positive context")
        regime = "pure" if pc == 0 else ("prefill" if n == 0 else "mixed")
        pre = ((pc, kp),) if pc else ()
        out.append(Batch(regime, "grid", np.full(n, kv, dtype=np.int64), pre, t * 1e-6, line))
    if not out:
        raise CodaError(f"attention CSV {path}: no rows")
    return out


def read_skew(path: Path) -> list[SkewRow]:
    """Rows of a skew CSV with their three batches each."""
    rows, first = _open(path, SKEW_COLUMNS, "skew")
    out: list[SkewRow] = []
    for k, row in enumerate(rows):
        line = first + k
        regime = row["regime"]
        if regime not in ("pure", "mixed"):
            raise CodaError(f"{path}:{line}: regime: {regime!r} must be pure or mixed")
        n, nb, pc, kp, kvs, kvb = (int(_num(path, line, row, c)) for c in ("n", "nb", "pc", "kp", "kvs", "kv_big"))
        kv_mean = _num(path, line, row, "kv_mean", float)
        times = [_num(path, line, row, c, float) for c in ("t_mean_us", "t_max_us", "t_skew_us")]
        if not 0 < nb < n or min(times) <= 0 or kvs <= 0 or kvb <= 0:
            raise CodaError(f"{path}:{line}: need 0 < nb < n, positive contexts and positive times")
        if regime == "mixed" and pc == 0:
            raise CodaError(f"{path}:{line}: pc: a mixed row needs a prefill chunk")
        pre = ((pc, kp),) if regime == "mixed" else ()
        skew = np.array([kvb] * nb + [kvs] * (n - nb), dtype=np.int64)
        mean = np.full(n, max(1, round(kv_mean)), dtype=np.int64)
        big = np.full(n, kvb, dtype=np.int64)
        out.append(
            SkewRow(
                regime,
                n,
                nb,
                kvs,
                kvb,
                Batch(regime, "mean", mean, pre, times[0] * 1e-6, line),
                Batch(regime, "max", big, pre, times[1] * 1e-6, line),
                Batch(regime, "skew", skew, pre, times[2] * 1e-6, line),
            )
        )
    if not out:
        raise CodaError(f"skew CSV {path}: no rows")
    return out


_NAME = re.compile(r"^(?P<gpu>[A-Za-z0-9]+)_(?P<model>.+?)_tp\d+_(attention|skew)\.csv$")


def hardware_of(path: Path) -> tuple[str, str] | None:
    """(GPU, model) from an LLMServingSim-style file name, e.g. RTX4090_Llama-3.1-8B_tp1_skew.csv."""
    m = _NAME.match(path.name)
    return (m["gpu"], m["model"]) if m else None
