"""What one simulation reports: its per-request records, the summary ``coda sim --json`` prints (the
metrics of ``coda.metrics`` with the run's configuration, profile and tier provenance), the shadow
policies' counts and the occupancy time series."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coda.metrics.requests import summarize
from coda.metrics.tasks import alone_times_s
from coda.shell.liveness import verdict

if TYPE_CHECKING:
    from coda.sim.cluster import Simulation


class SimResult:
    """Records and summary of one simulation."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.records = [r.record() for r in sim.requests]

    def summary(self) -> dict[str, Any]:
        sim = self.sim
        cfg = sim.config
        out = summarize(
            self.records,
            sim.window,
            ttft_slo_s=cfg.slo.ttft_s,
            tbt_slo_s=cfg.slo.tbt_s,
            gaps=sim.recorder.gaps(),
            decode_concurrency=sim.recorder.decode_concurrency(cfg.workers),
            run_end_s=sim.loop.now,
            alone_s=self.alone_s(),
        )
        paths: dict[str, int] = {}
        for r in self.records:
            if r["measured"] and r["round"] > 0 and r["path"]:
                paths[r["path"]] = paths.get(r["path"], 0) + 1
        resumed = max(sum(paths.values()), 1)
        out.update(
            {
                "system": cfg.system,
                "sim_time_s": sim.loop.now,
                "wall_s": sim.wall_s,
                "speed_x": sim.loop.now / max(sim.wall_s, 1e-9),
                "steps": sum(w.steps for w in sim.workers),
                "decode_steps": sum(w.decode_steps for w in sim.workers),
                "events": sim.loop.events_run,
                "preemptions": sum(r["preemptions"] for r in self.records),
                "w_max": self.w_max_block(),
                "resumed_paths": {k: v / resumed for k, v in sorted(paths.items())},
                "shadow": self.shadow_block(),
                "ingress": ({"policy": sim.policies.spec.ingress.name, "decisions": dict(sorted(sim.ingress.decisions.items())),
                             "deferred": sum(r["deferred"] for r in self.records if r["measured"]),
                             "liveness": (live := sim.ingress.liveness.report()), "verdict": verdict(live)} if sim.ingress else None),
                "window_s": [sim.window.start_s, sim.window.end_s],
                "config": self.config_block(),
            }
        )
        return out

    def alone_s(self) -> dict[str, list[float]]:
        """Each measured session's time alone on an idle worker through each round, under this run's
        cost model (slowdown's denominator; only sessions whose first round was ready in the window)."""
        sim, cfg = self.sim, self.sim.config
        measured = {r["session_id"] for r in self.records if r["round"] == 0 and r["measured"]}
        return {s.session_id: alone_times_s(s, sim.cost, chunk_tokens=sim.C, max_num_batched_tokens=cfg.max_num_batched_tokens,
                                            decode_run_max=cfg.decode_run_max) for s in sim.workload.sessions if s.session_id in measured}

    def w_max_block(self) -> dict[str, Any] | None:
        """W_max's liveness over the whole run: admissions of requests that had waited W_max and the
        running requests preempted for them (``preempt``); ``None`` for a state policy without W_max."""
        w = self.sim.workers[0]
        if w.w_max_s is None:
            return None
        return {"w_max_s": w.w_max_s, "preempt": w.w_max_preempt, "admissions": sum(w.w_max_admissions for w in self.sim.workers),
                "preemptions": sum(w.w_max_preemptions for w in self.sim.workers)}

    def shadow_block(self) -> dict[str, Any]:
        """How often a shadow policy, on the same snapshots in the measurement window, would have decided
        differently: over admission choices (the shadow admitting another request or none), routing
        decisions, ingress decisions (another action) or decode-batch plans, by kind."""
        return {kind: shadowed.report() for kind, shadowed in self.sim.policies.shadows().items()}

    def config_block(self) -> dict[str, Any]:
        sim = self.sim
        p = sim.preset
        return {
            **sim.config.model_dump(),
            "preset": {"name": p.name, "description": p.description},
            "policies": sim.policies.spec.describe(),
            "tiers": sim.tiers.describe(),
            "profile": {
                "name": sim.profile.name,
                "kind": sim.profile.kind,
                "description": sim.profile.description,
                "tp": sim.profile.tp,
                "engine_time": sim.profile.engine_time_note(),
                "extrapolated": sim.profile.beyond_measured(
                    sim.config.max_num_batched_tokens, sim.config.max_num_seqs, sim.largest_request_tokens
                ),
            },
            "workload": {k: v for k, v in sim.workload.meta.items() if k != "choices"}
            | {"sessions": len(sim.workload.sessions), "requests": sim.workload.num_requests},
            "slo": sim.config.slo.model_dump(),
        }

    def occupancy(self) -> dict[str, list[float]]:
        return self.sim.recorder.samples
