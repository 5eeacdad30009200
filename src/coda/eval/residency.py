"""Where resumed requests find their reusable KV, from per-request records alone: a real engine's
log (its prompt tokens and the prompt tokens it served from its prefix cache, which vLLM reports
as ``usage.prompt_tokens_details.cached_tokens`` with ``--enable-prompt-tokens-details``) or a
simulation's records, read under one definition so the two can be compared request by request.

A request is *resumed* when it continues a session (round > 0). Its reusable prefix is what the
record states (``reusable_tokens``) or else the session's previous context (the previous round's
prompt and output tokens), counted in whole KV blocks and at most the prompt less its last token
(an engine always computes that one). A resumed request is *HBM-ready* when the engine served its
whole reusable prefix from its cache; otherwise part of the prefix was recomputed (a plain vLLM
engine has no other tier; a simulation's records also say DRAM and SSD hits, which count as
found in those tiers).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coda.errors import CodaError, reading
from coda.workload.schema import open_text

PATHS = ("hbm", "dram", "ssd", "recompute")
LOG_FIELDS = "session_id, round, prompt_tokens, output_tokens and cached_tokens (or hbm_hit_tokens)"
#: names a log's columns may go by (the first present wins): Coda's records, vLLM's usage fields
NAMES: dict[str, tuple[str, ...]] = {
    "session": ("session_id", "session"),
    "round": ("round",),
    "prompt": ("server_prompt_tokens", "prompt_tokens"),  # coda bench: the engine's count first
    "output": ("output_tokens", "completion_tokens"),
    "cached": ("cached_tokens", "hbm_hit_tokens"),
    "dram": ("dram_hit_tokens",),
    "ssd": ("ssd_hit_tokens",),
    "reusable": ("reusable_tokens",),
    "ready": ("ready_s", "arrival_s", "arrival_time"),
    "first_token": ("first_token_s",),
}
OPTIONAL = {"dram", "ssd", "reusable", "ready", "first_token"}


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One completed request, as its engine (or the simulator) saw it."""

    session: str
    round: int
    prompt: int
    output: int
    cached: int  # prompt tokens served from the engine's own (HBM) prefix cache
    dram: int = 0
    ssd: int = 0
    reusable: int | None = None
    ready_s: float | None = None
    first_token_s: float | None = None


def record_from(row: dict[str, Any]) -> RequestRecord:
    """A record from a dict of Coda's per-request fields (``coda sim`` and ``coda bench`` write them)."""
    return _parse(row, lambda field, problem: CodaError(f"record: {field}: {problem}"))


def _parse(row: dict[str, Any], fail: Any) -> RequestRecord:
    got: dict[str, Any] = {}
    for key, names in NAMES.items():
        name = next((n for n in names if n in row and row[n] is not None), None)
        if name is None:
            if key in OPTIONAL:
                continue
            raise fail("row", f"no {names[0]} field (each line needs {LOG_FIELDS})")
        value = row[name]
        if key == "session":
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise fail(name, f"{value!r} is not a session id (a string)")
            got[key] = str(value)
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if key in ("ready", "first_token"):
            if not number:
                raise fail(name, f"{value!r} is not a time in seconds")
            got[key + "_s"] = float(value)
            continue
        if not number or float(value) != int(value) or value < 0:
            raise fail(name, f"{value!r} is not a token count (an integer >= 0)")
        got[key] = int(value)
    if got["cached"] + got.get("dram", 0) + got.get("ssd", 0) > got["prompt"]:
        raise fail(NAMES["cached"][0], f"{got['cached']} cached tokens exceed the {got['prompt']}-token prompt")
    return RequestRecord(**got)


def read_engine_log(path: Path) -> list[RequestRecord]:
    """A JSONL log of completed requests, one a line with at least ``LOG_FIELDS`` (``coda bench
    --out`` writes ``requests.jsonl`` in this form); rows whose ``state`` says they did not complete
    are skipped. A malformed line is one error naming the file, the line and the field."""
    path = Path(path)
    out: list[RequestRecord] = []
    with reading(path, "engine log"), open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue

            def fail(field: str, problem: str, lineno: int = lineno) -> CodaError:
                return CodaError(f"{path}:{lineno}: {field}: {problem}; fix the line or pass a log of completed requests")

            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise fail("json", f"not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise fail("row", "not a JSON object")
            if row.get("state", "completed") != "completed":
                continue
            out.append(_parse(row, fail))
    if not out:
        raise CodaError(f"{path}: no completed requests; pass a log with one JSON object per completed request ({LOG_FIELDS})")
    return out


@dataclass(frozen=True, slots=True)
class Resumed:
    """A resumed request's reusable prefix (in whole blocks, at most the prompt less one token) and where it was found."""

    record: RequestRecord
    reusable: int
    path: str


def resumed(records: Iterable[RequestRecord], block_tokens: int) -> list[Resumed]:
    """The resumed requests with their reusable prefix and path (see the module docstring)."""
    by_session: dict[str, dict[int, RequestRecord]] = {}
    for r in records:
        by_session.setdefault(r.session, {})[r.round] = r
    out = []
    for rounds in by_session.values():
        for k, r in sorted(rounds.items()):
            if k == 0:
                continue
            if r.reusable is not None:
                reusable = r.reusable
            elif (prev := rounds.get(k - 1)) is not None:
                reusable = prev.prompt + prev.output
            else:
                continue  # the previous round is not in the log: its context is unknown
            whole = min(reusable, r.prompt - 1) // block_tokens * block_tokens
            found = r.cached + r.dram + r.ssd
            path = "recompute" if found < whole else "ssd" if r.ssd else "dram" if r.dram else "hbm"
            out.append(Resumed(r, whole, path))
    return out


def path_shares(records: Iterable[RequestRecord], block_tokens: int) -> dict[str, Any]:
    """The preparation paths of resumed requests and the tiers holding their reusable tokens, as
    ``coda characterize`` reports them for a simulated replay (its F1 and F2)."""
    res = resumed(records, block_tokens)
    counts = {p: sum(x.path == p for x in res) for p in PATHS}
    tokens = {"hbm": float(sum(min(x.record.cached, x.reusable) for x in res)),
              "dram": float(sum(x.record.dram for x in res)), "ssd": float(sum(x.record.ssd for x in res))}
    tokens["not_resident"] = float(sum(max(0, x.reusable - x.record.cached - x.record.dram - x.record.ssd) for x in res))
    total = sum(tokens.values())
    return {
        "requests": len(res),
        "counts": counts,
        "share": {p: c / len(res) if res else None for p, c in counts.items()},
        "tokens": tokens,
        "token_share": {k: v / total if total else None for k, v in tokens.items()},
        "block_tokens": block_tokens,
        "definition": "resumed requests (round > 0): reusable prefix = the record's reusable_tokens or the previous round's "
        "prompt + output, in whole blocks, at most prompt - 1; hbm = all of it served from the engine's cache",
    }


def compare(real: Sequence[RequestRecord], sim: Sequence[RequestRecord], block_tokens: int, tolerance: float = 0.05) -> dict[str, Any]:
    """Request by request: the engine's cached tokens against the simulator's HBM hits for the
    requests completed in both (matched by session and round), and the HBM-ready share of each."""
    sim_by = {(r.session, r.round): r for r in sim}
    # the reusable prefix is the workload's: a log that does not state it takes the simulation's
    pairs = [(r if r.reusable is not None else replace(r, reusable=s.reusable), s)
             for r in real if (s := sim_by.get((r.session, r.round))) is not None]
    if not pairs:
        raise CodaError("no request completed in both the engine's log and the simulation; compare runs of the same workload")
    agree = [abs(r.cached - s.cached) <= tolerance * r.prompt for r, s in pairs]
    keys = {(r.session, r.round) for r, _ in pairs}
    ready_real = [x.path == "hbm" for x in resumed([r for r, _ in pairs], block_tokens)]
    ready_sim = [x.path == "hbm" for x in resumed([s for _, s in pairs], block_tokens) if (x.record.session, x.record.round) in keys]
    diff = [r.cached - s.cached for r, s in pairs]
    return {
        "requests": len(pairs),
        "real_only": len(real) - len(pairs),
        "sim_only": len(sim) - len(pairs),
        "agreement_share": sum(agree) / len(pairs),
        "tolerance_of_prompt": tolerance,
        "resumed": len(ready_real),
        "hbm_ready_real": sum(ready_real) / len(ready_real) if ready_real else None,
        "hbm_ready_sim": sum(ready_sim) / len(ready_sim) if ready_sim else None,
        "cached_tokens_real": sum(r.cached for r, _ in pairs),
        "cached_tokens_sim": sum(s.cached for _, s in pairs),
        "sim_more": sum(d < -tolerance * r.prompt for d, (r, _) in zip(diff, pairs, strict=True)),
        "real_more": sum(d > tolerance * r.prompt for d, (r, _) in zip(diff, pairs, strict=True)),
    }
