"""A denominator that does not depend on the policy: what each session of the workload offers
inside the measurement window at the unloaded pace.

A replay records the rounds its clients send. Under overload that count depends on the policy:
a session slowed by queueing sends its later rounds late, after the window, so they are never
offered; a session turned away is abandoned, and its unsent rounds are charged from the moment it
was refused. Comparing goodputs over those two denominators favours whichever policy shrinks its
own. Here every session offers round k at the time it would become ready had every earlier round
been served instantly from the session's start (its trace timing: start, tool and think times;
``unloaded_ready_s``), and round k counts as offered when that time falls inside the window,
whatever the policy did. Goodput is the share of those rounds that completed within the SLO;
session goodput the share of the sessions whose every round is offered that completed every
round within the SLO. Arrival-driven replays only: with ``max_concurrency`` a session starts when
a slot frees, which depends on the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from coda.metrics.requests import Window, column, within_slo
from coda.workload.schema import Session, Workload, next_ready_s


def unloaded_ready_s(session: Session, time_scale: float = 1.0) -> list[float]:
    """When each round of ``session`` becomes ready if every round is served instantly: its first
    at the session's start (or its own timestamp), each next one after the previous round's tool
    and think time (``next_ready_s``), on the replay's clock (trace seconds times ``time_scale``)."""
    first = session.rounds[0]
    out = [max(session.start_s * time_scale, first.at_s * time_scale if first.at_s is not None else 0.0)]
    for k in range(len(session.rounds) - 1):
        out.append(next_ready_s(session, k, out[k], time_scale))
    return out


def symmetric_summary(records: Sequence[Mapping[str, Any]], workload: Workload, window: Window, *, time_scale: float,
                      ttft_slo_s: float, tbt_slo_s: float) -> dict[str, Any]:
    """Counts, goodput and session goodput over the rounds the workload offers in ``window`` at the
    unloaded pace (see the module docstring); ``records`` are a replay's, one per round it recorded.
    A round offered here but never recorded (its session was still behind when the run ended) is
    ``unsent``: it counts against goodput as a refused one does."""
    slo_ok = within_slo(np.array([r.get("state") == "completed" and r.get("finish_s") is not None for r in records], dtype=bool),
                        column(records, "first_token_s") - column(records, "ready_s"), column(records, "tbt_mean_s"),
                        column(records, "output_tokens", 0.0), ttft_slo_s, tbt_slo_s)
    by_round = {(r["session_id"], r["round"]): (r, bool(ok)) for r, ok in zip(records, slo_ok)}
    counts = dict.fromkeys(("offered", "admitted", "deferred", "completed", "rejected", "failed", "unsent", "slo_met"), 0)
    sessions = sessions_completed = sessions_good = 0
    for s in workload.sessions:
        ready = unloaded_ready_s(s, time_scale)
        inside = [window.start_s <= t <= window.end_s for t in ready]
        done = good = 0
        for k, offered in enumerate(inside):
            rec, ok = by_round.get((s.session_id, k), (None, False))
            completed = rec is not None and rec.get("state") == "completed"
            done, good = done + completed, good + ok
            if not offered:
                continue
            counts["offered"] += 1
            if rec is None:
                counts["unsent"] += 1
                continue
            counts["admitted"] += bool(rec.get("admitted", completed))
            counts["deferred"] += bool(rec.get("deferred"))
            counts[rec["state"] if rec.get("state") in ("completed", "rejected", "failed") else "failed"] += 1
            counts["slo_met"] += ok
        if all(inside):
            sessions += 1
            sessions_completed += done == len(ready)
            sessions_good += good == len(ready)
    return {**counts, "goodput": counts["slo_met"] / max(counts["offered"], 1), "slo_rps": counts["slo_met"] / window.length_s,
            "sessions_offered": sessions, "sessions_completed": sessions_completed, "sessions_good": sessions_good,
            "session_goodput": sessions_good / max(sessions, 1)}
