"""Goodput over a denominator that charges every door the same rounds: those each session of the
workload would make ready inside the measurement window at the unloaded pace, whatever the door
did to it.

A replay records the rounds its clients send. A session slowed by queueing sends its later rounds
late, past the window, so the replay never offers them; a session turned away is abandoned, and the
replay charges its unsent rounds as if it had been served instantly from the moment it was refused.
Comparing goodputs on either count favours one kind of door. Here the charged rounds come from the
workload alone: session s's round k is charged when the time it would become ready at the unloaded
pace, from the session's start, each earlier round served in its time alone on an idle engine (from
the engine's cost profile, ``coda.metrics.tasks.alone_times_s``; instantly where none is given) and
followed by its tool and think time (``unloaded_ready_s``), falls inside the window. A session
refused at round k and one slowed at round k are charged the same rounds. Each charged round ends
as what the client saw of it when it was sent by the window's end (completed, rejected or failed),
as ``abandoned`` (and its session's refusal) when its session was refused first, or as ``late``
(slowed past the window, or not sent before the run stopped). Only charged rounds completed within
the SLO count as met. Session goodput: the sessions that start in the window and would end in it at
the unloaded pace, completed with every round within the SLO, over those sessions.
Arrival-driven replays only: with ``max_concurrency`` a session starts when a slot frees, which
depends on the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from coda.metrics.requests import RUN_ENDED, Window, column, within_slo
from coda.workload.schema import Session, Workload, next_ready_s

ABANDONED = "session_abandoned"


def unloaded_ready_s(session: Session, time_scale: float = 1.0, alone_ends_s: Sequence[float] | None = None) -> list[float]:
    """When each round of ``session`` becomes ready at the unloaded pace, on the replay's clock
    (trace seconds times ``time_scale``, as an engine that simulates its profile ``1 / time_scale``
    times faster serves it): its first at the session's start (or its own timestamp), each next one
    after the previous round ended (``alone_ends_s``: each round's end alone, in trace seconds after
    the first round became ready, as ``alone_times_s`` gives them; without them, the moment it
    became ready) and its tool and think time."""
    first = session.rounds[0]
    out = [max(session.start_s, first.at_s if first.at_s is not None else 0.0)]
    for k in range(len(session.rounds) - 1):
        out.append(next_ready_s(session, k, out[0] + alone_ends_s[k] if alone_ends_s is not None else out[k]))
    return [t * time_scale for t in out]


def symmetric_summary(records: Sequence[Mapping[str, Any]], workload: Workload, window: Window, *, time_scale: float,
                      ttft_slo_s: float, tbt_slo_s: float, alone_s: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """Counts, goodput, SLO-meeting rounds per second and session goodput on the rule of the module
    docstring; ``records`` are a replay's (``coda bench``'s requests.jsonl)."""
    sent = [r for r in records if r.get("reason") != ABANDONED]
    finished = np.array([r.get("state") == "completed" and r.get("finish_s") is not None for r in sent], dtype=bool)
    ok = within_slo(finished, column(sent, "first_token_s") - column(sent, "ready_s"),
                    column(sent, "tbt_mean_s"), column(sent, "output_tokens", 0.0), ttft_slo_s, tbt_slo_s)
    counts = dict.fromkeys(("offered", "admitted", "deferred", "completed", "rejected", "failed", "abandoned", "late", "slo_met"), 0)
    by_session: dict[str, dict[int, tuple[Mapping[str, Any], bool]]] = {}
    for r, good in zip(sent, ok):
        by_session.setdefault(r["session_id"], {})[r["round"]] = (r, bool(good))
    sessions = sessions_completed = sessions_good = 0
    for s in workload.sessions:
        rounds = by_session.get(s.session_id, {})
        ready = unloaded_ready_s(s, time_scale, alone_s.get(s.session_id) if alone_s is not None else None)
        refusal: str | None = None  # the state of the round that ended the session, once it was refused
        for k in range(len(s.rounds)):
            r, good = rounds.get(k, (None, False))
            if r is not None and r.get("state") in ("rejected", "failed") and r.get("reason") not in RUN_ENDED:
                refusal = refusal or r["state"]
            if not window.start_s <= ready[k] <= window.end_s:
                continue
            counts["offered"] += 1
            if r is not None and r["ready_s"] <= window.end_s:
                counts["admitted"] += bool(r.get("admitted"))
                counts["deferred"] += bool(r.get("deferred"))
                counts[r["state"] if r.get("state") in ("completed", "rejected", "failed") else "failed"] += 1
                counts["slo_met"] += good
            elif refusal is not None:
                counts["abandoned"] += 1
                counts[refusal] += 1
            else:
                counts["late"] += 1
        if (
            0 in rounds
            and window.start_s <= rounds[0][0]["ready_s"] <= window.end_s
            and ready[-1] - ready[0] <= window.end_s - rounds[0][0]["ready_s"]
        ):
            sessions += 1
            sessions_completed += all(k in rounds and rounds[k][0].get("state") == "completed" for k in range(len(s.rounds)))
            sessions_good += all(k in rounds and rounds[k][1] for k in range(len(s.rounds)))
    return {
        **counts,
        "goodput_symmetric": counts["slo_met"] / max(counts["offered"], 1),
        "slo_rps_symmetric": counts["slo_met"] / window.length_s,
        "sessions_offered": sessions,
        "sessions_completed": sessions_completed,
        "sessions_good": sessions_good,
        "session_goodput": sessions_good / max(sessions, 1),
    }
