"""A cluster of simulated workers behind a router, driven by closed-loop agent sessions.

A session's next round becomes ready when its previous round completes plus the tool time (or
user think time) that followed it; open-loop rounds (``at_s``) are ready at their timestamp, but
never before the previous round of their session completed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coda.cost.model import CostModel, build_cost_model
from coda.cost.profile import GiB, Profile, load_profile
from coda.errors import CodaError
from coda.kvindex import KVIndexer, WorkerTiers
from coda.metrics import Window, summarize
from coda.policy.registry import SystemPreset, make_execution_policy, make_ingress_policy, make_router, make_state_policy, system_preset
from coda.policy.tools import ToolPredictor
from coda.sim.config import SimConfig
from coda.sim.ingress import SIM_SIGNALS, SimIngress
from coda.sim.kvcache import OWNER_SHIFT, HbmPool, KVListener, KVStore, ToolAwareEvictor, Versions
from coda.sim.loop import EventLoop
from coda.sim.metrics import Recorder
from coda.sim.observe import SimObserver
from coda.sim.request import REJECTED, SessionState, SimRequest
from coda.sim.worker import NodeLinks, Worker
from coda.types import PrefixMatch, RouteRequest, RoutingSnapshot, WorkerView
from coda.workload.schema import Workload, next_ready_s, reused_prefix_of, unsent_ready_s
from coda.workload.stats import workload_duration_s


@dataclass(frozen=True, slots=True)
class Tiers:
    dram: bool
    ssd: bool
    cpu_shadow: bool
    hbm_chunks: int
    dram_chunks: int
    ssd_chunks: int
    per_worker: bool

    def describe(self) -> dict[str, Any]:
        return {
            "dram": self.dram,
            "ssd": self.ssd,
            "cpu_shadow": self.cpu_shadow,
            "per_worker_stores": self.per_worker,
            "hbm_chunks_per_worker": self.hbm_chunks,
            "dram_chunks_per_store": self.dram_chunks,
            "ssd_chunks_per_store": self.ssd_chunks,
        }


def resolve_tiers(config: SimConfig, preset: SystemPreset, profile: Profile, chunk_bytes: int) -> Tiers:
    """Tier sizes in chunks from the profile, the preset's tier choice and the config's overrides."""
    t = profile.tiers
    hbm = (config.hbm_kv_gib * GiB) if config.hbm_kv_gib is not None else t.hbm_kv_bytes
    dram_on = preset.dram if config.dram is None else config.dram
    ssd_on = preset.ssd if config.ssd is None else config.ssd
    dram = (config.dram_kv_gib * GiB) if config.dram_kv_gib is not None else t.dram_kv_bytes
    ssd = (config.ssd_kv_gib * GiB) if config.ssd_kv_gib is not None else t.ssd_kv_bytes
    per = config.per_worker_tiers
    if per:  # a node's store split among its workers
        dram /= t.workers_per_node
        ssd /= t.workers_per_node
    hbm_chunks = int(hbm // chunk_bytes)
    if hbm_chunks < 1:
        raise CodaError(f"HBM KV of {hbm / GiB:.3g} GiB holds no {chunk_bytes / 2**20:.3g} MiB chunk; raise hbm_kv_gib or lower chunk_tokens")
    return Tiers(
        dram=dram_on,
        ssd=ssd_on and dram_on,
        cpu_shadow=(preset.cpu_shadow if config.cpu_shadow is None else config.cpu_shadow) and dram_on,
        hbm_chunks=hbm_chunks,
        dram_chunks=int(dram // chunk_bytes) if dram_on else 0,
        ssd_chunks=int(ssd // chunk_bytes) if ssd_on and dram_on else 0,
        per_worker=per,
    )


class Simulation:
    """Build once, ``run()`` once."""

    def __init__(
        self,
        workload: Workload,
        config: SimConfig,
        *,
        cost: CostModel | None = None,
        kv_listener: KVListener | None = None,
        observers: Sequence[SimObserver] = (),
    ) -> None:
        self.workload = workload
        self.config = config
        self.preset = system_preset(config.system)
        self.profile = cost.profile if cost is not None else load_profile(config.profile)
        self.cost = cost or build_cost_model(self.profile)
        C = config.chunk_tokens
        self.C = C
        chunk_bytes = self.cost.kv_bytes(C)
        self.tiers = resolve_tiers(config, self.preset, self.profile, chunk_bytes)
        self._check_workload()

        duration = workload_duration_s(workload)
        warmup = config.warmup_s if config.warmup_s is not None else duration / 3.0
        if warmup >= duration:
            raise CodaError(f"warmup_s={warmup:g} leaves no measurement window in a {duration:g} s workload; lower warmup_s")
        self.window = Window(warmup, duration)
        self.horizon = duration + (config.drain_s if config.drain_s is not None else duration)

        self.loop = EventLoop()
        self.versions = Versions()
        self.recorder = Recorder(self.window)
        params = config.policy_params
        pp = self.preset
        self.router = make_router(pp.router, params.get(pp.router))
        self.observers = tuple(observers)
        self.shadow_router = make_router(config.shadow_router, params.get(config.shadow_router)) if config.shadow_router else None
        self.router_shadow = {"decisions": 0, "differs": 0}
        self.router_needs = frozenset(getattr(self.router, "needs", ())).union(
            *(ob.needs for ob in self.observers), getattr(self.shadow_router, "needs", frozenset())
        )
        self.tool_predictor = ToolPredictor() if pp.eviction == "tool_aware" else None
        self.ingress = self._ingress(config)
        self._owner_session: dict[int, SessionState] = {}

        self.indexer = KVIndexer() if config.indexer else None
        if self.indexer is not None:
            kv_listener = self._indexing_listener(kv_listener)
        wpn = 1 if self.tiers.per_worker else self.profile.tiers.workers_per_node
        n_stores = math.ceil(config.workers / wpn)
        self.ssd_stores = [KVStore("ssd", i, self.tiers.ssd_chunks, self.versions, listener=kv_listener) if self.tiers.ssd else None for i in range(n_stores)]
        self.dram_stores = [
            KVStore("dram", i, self.tiers.dram_chunks, self.versions, lower=self.ssd_stores[i], listener=kv_listener) if self.tiers.dram else None
            for i in range(n_stores)
        ]
        links = [NodeLinks() for _ in range(n_stores)]
        self.workers = [
            Worker(
                w,
                self.loop,
                self.cost,
                HbmPool(w, self.tiers.hbm_chunks, self.versions, kv_listener, self._evictor()),
                self.dram_stores[w // wpn],
                self.ssd_stores[w // wpn],
                links[w // wpn],
                self.versions,
                make_state_policy(pp.state, self.cost, params.get(pp.state)),
                make_execution_policy(pp.execution, self.cost, params.get(pp.execution)),
                self.recorder,
                self._finished,
                chunk_tokens=C,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                decode_run_max=config.decode_run_max,
                cpu_shadow=self.tiers.cpu_shadow,
                observers=self.observers,
                shadow=make_state_policy(config.shadow_state, self.cost, params.get(config.shadow_state)) if config.shadow_state else None,
            )
            for w in range(config.workers)
        ]
        self._worker_tiers = [
            WorkerTiers(w, f"hbm:{w}", f"dram:{w // wpn}" if self.tiers.dram else None, f"ssd:{w // wpn}" if self.tiers.ssd else None)
            for w in range(config.workers)
        ]
        self._group_owner: dict[str, int] = {}
        self._trace_owner = self.versions.new_owner()
        self._interned: dict[tuple[int, int], int] = {}
        self.sessions = [SessionState(i, s, self.versions.new_owner()) for i, s in enumerate(workload.sessions)]
        self._owner_session.update((sess.owner, sess) for sess in self.sessions)
        self.requests: list[SimRequest] = []
        self._route_seq = 0
        self.live_sessions = 0
        self.open_measured = 0
        self.wall_s = 0.0

    def _ingress(self, config: SimConfig) -> SimIngress | None:
        if not config.ingress:
            return None
        policy = make_ingress_policy(config.ingress, config.policy_params.get(config.ingress))
        missing = sorted(policy.needs - SIM_SIGNALS)
        if missing:
            raise CodaError(f"ingress policy {config.ingress} needs {', '.join(missing)}, which the simulator cannot supply")
        return SimIngress(policy, config.defer_max_s, config.tenant_weights)

    def _indexing_listener(self, downstream: KVListener | None) -> KVListener:
        indexer = self.indexer
        assert indexer is not None

        def listener(event: str, where: int, tier: str, chunks: Sequence[int]) -> None:
            (indexer.stored if event == "stored" else indexer.removed)(f"{tier}:{where}", chunks)
            if downstream is not None:
                downstream(event, where, tier, chunks)

        return listener

    def _evictor(self) -> ToolAwareEvictor | None:
        if self.tool_predictor is None:
            return None
        return ToolAwareEvictor(self.config.eviction_window_chunks, self._predicted_out)

    def _predicted_out(self, owner: int) -> float:
        """Predicted remaining tool (or user) time of the session owning a chunk; 0 if not out."""
        sess = self._owner_session.get(owner)
        if sess is None or sess.out_since is None or self.tool_predictor is None:
            return 0.0
        return self.tool_predictor.remaining(sess.out_tools, self.loop.now - sess.out_since)

    # --- validation ------------------------------------------------------------------------
    def _check_workload(self) -> None:
        C = self.C
        bt = self.workload.block_tokens
        if bt and bt % C:
            raise CodaError(f"chunk_tokens={C} must divide the workload's block_tokens={bt}; use a divisor such as {math.gcd(bt, C) or bt}")
        largest = 0
        for s in self.workload.sessions:
            context = 0
            for i, r in enumerate(s.rounds):
                prompt = reused_prefix_of(r, context, i) + r.new_input_tokens
                largest = max(largest, prompt + r.output_tokens)
                context = prompt + r.output_tokens
        need = -(-(largest + 1) // C)
        if need > self.tiers.hbm_chunks:
            raise CodaError(
                f"HBM holds {self.tiers.hbm_chunks} chunks of {C} tokens but the workload's largest request needs {need}; "
                "raise hbm_kv_gib or use a profile with more KV memory"
            )

    # --- sessions --------------------------------------------------------------------------
    def _chain(self, sess: SessionState, k: int, prefix: int, prompt: int) -> tuple[list[int], tuple[int, ...]]:
        """Chunk ids of the prompt's full chunks: reused prefix ids, then fresh content."""
        C = self.C
        rnd = sess.session.rounds[k]
        full = prompt // C
        group = sess.session.prefix_group
        if rnd.block_hashes is not None:
            bt = self.workload.block_tokens or C
            per = bt // C
            intern = self._interned
            base = self._trace_owner << OWNER_SHIFT
            chain = []
            for j in range(full):
                key = (rnd.block_hashes[j // per], j % per)
                cid = intern.get(key)
                if cid is None:
                    cid = intern[key] = base | len(intern)
                chain.append(cid)
            return chain, (self._trace_owner, sess.owner)
        owners: tuple[int, ...] = (sess.owner,)
        if group is not None:
            g = self._group_owner.get(group)
            if g is None:
                g = self._group_owner[group] = self.versions.new_owner()
            owners = (g, sess.owner)
        if k == 0:
            base_ids = [(owners[0] << OWNER_SHIFT) | j for j in range(prefix // C)] if group is not None else []
        else:
            base_ids = sess.chain[: prefix // C]
        base_ids = base_ids[:full]
        return base_ids + sess.fresh_ids(full - len(base_ids)), owners

    def _start_session(self, sess: SessionState) -> None:
        self.live_sessions += 1
        self._ready(sess)

    def _ready(self, sess: SessionState) -> None:
        now = self.loop.now
        if sess.out_since is not None:
            if self.tool_predictor is not None:
                self.tool_predictor.observe(sess.out_tools, now - sess.out_since)
            sess.out_since = None
        k = sess.next_round
        rnd = sess.session.rounds[k]
        req = SimRequest(len(self.requests), sess, k, rnd.kind, now)
        prefix = reused_prefix_of(rnd, sess.context_tokens, k)
        prompt = prefix + rnd.new_input_tokens
        req.prompt_tokens = req.orig_prompt_tokens = prompt
        req.new_input_tokens = rnd.new_input_tokens
        req.reused_tokens = prefix
        req.output_tokens = rnd.output_tokens
        req.chain, req.owners = self._chain(sess, k, prefix, prompt)
        req.tools = tuple(t.name for t in rnd.tools)
        req.measured = self.window.start_s <= now <= self.window.end_s
        self.open_measured += req.measured
        self.requests.append(req)
        if self.ingress is None:
            self.workers[self._route(req, sess)].enqueue(req)
        else:
            self._admit_or_not(req)

    # --- ingress ---------------------------------------------------------------------------
    def _admit_or_not(self, req: SimRequest) -> None:
        ing = self.ingress
        assert ing is not None
        now = self.loop.now
        sess = req.sess
        tenant = sess.session.tenant or "default"
        hit = 0.0
        if "prefix_hit" in ing.policy.needs and req.prompt_tokens:
            best = max((m.hbm_blocks + m.dram_blocks + m.ssd_blocks for m in self._matches(req.chain).values()), default=0)
            hit = best * self.C / req.prompt_tokens
        d = ing.decide(ing.snapshot(now, req, tenant, self.workers, hit))
        if d.action == "admit":
            wid = self._route(req, sess)
            ing.admitted(wid, tenant, req.orig_prompt_tokens)
            self.workers[wid].enqueue(req)
        elif d.action == "defer":
            if req.deferred_since < 0:
                req.deferred_since = now
            retry = max(d.retry_after_s, 0.05)
            if now + retry - req.deferred_since > self.config.defer_max_s:
                self._reject(req, "defer_timeout")
            else:
                self.loop.at(now + retry, self._admit_or_not, req)
        else:
            self._reject(req, d.reason)

    def _reject(self, req: SimRequest, reason: str) -> None:
        """A rejected request ends its session: the client gives up, and its unsent rounds count as
        rejected, each when it would have become ready (see ``unsent_ready_s``)."""
        req.state, req.reason = REJECTED, reason
        self.open_measured -= req.measured
        sess = req.sess
        for k, ready in unsent_ready_s(sess.session, req.round_idx + 1, self.loop.now):
            rnd = sess.session.rounds[k]
            gone = SimRequest(len(self.requests), sess, k, rnd.kind, ready)
            gone.state, gone.reason = REJECTED, "session_abandoned"
            gone.new_input_tokens = rnd.new_input_tokens
            gone.output_tokens = rnd.output_tokens
            gone.measured = self.window.start_s <= ready <= self.window.end_s
            self.requests.append(gone)
        sess.done = True
        self.live_sessions -= 1

    def _route(self, req: SimRequest, sess: SessionState) -> int:
        self._route_seq += 1
        needs = self.router_needs
        matches = self._matches(req.chain) if "match" in needs else {}
        views = []
        for w in self.workers:
            match = matches.get(w.id, PrefixMatch())
            views.append(
                WorkerView(
                    worker_id=w.id,
                    active_requests=w.active_requests,
                    active_kv_blocks=w.hbm.used - len(w.hbm.lru),
                    waiting_requests=len(w.waiting),
                    decode_contexts=w.decode_contexts() if "decode_contexts" in needs else (),
                    match=match,
                )
            )
        rr = RouteRequest(
            seq=self._route_seq - 1,
            session_id=sess.session.session_id,
            is_continuation=req.round_idx > 0,
            prompt_tokens=req.prompt_tokens,
            prompt_blocks=len(req.chain),
            reusable_tokens=req.reused_tokens,
            new_tokens=req.new_input_tokens,
            last_worker=sess.last_worker,
        )
        snap = RoutingSnapshot(self.loop.now, rr, tuple(views))
        wid = self.router.route(snap)
        if self.shadow_router is not None and self.window.start_s <= snap.now_s <= self.window.end_s:
            self.router_shadow["decisions"] += 1
            self.router_shadow["differs"] += self.shadow_router.route(snap) != wid
        for ob in self.observers:
            ob.on_route(snap, wid)
        if not 0 <= wid < len(self.workers):
            raise AssertionError(f"router {self.router.name} chose worker {wid} outside 0..{len(self.workers) - 1}")
        return wid

    def _matches(self, chain: Sequence[int]) -> dict[int, PrefixMatch]:
        """The prompt's resident prefix per worker, from the pools or through the indexer."""
        if self.indexer is not None:
            return self.indexer.match(chain, self._worker_tiers)
        out = {}
        for w in self.workers:
            h, _ = w.hbm.leading_hits(chain)
            d = w.dram.leading(chain, h) if w.dram is not None else 0
            s = w.ssd.leading(chain, h + d) if w.ssd is not None else 0
            out[w.id] = PrefixMatch(h, d, s)
        return out

    def _finished(self, req: SimRequest) -> None:
        sess = req.sess
        if self.ingress is not None:
            self.ingress.finished(req.worker, sess.session.tenant or "default", req.orig_prompt_tokens)
        sess.context_tokens = req.orig_prompt_tokens + req.output_tokens
        sess.last_worker = req.worker
        self.open_measured -= req.measured
        k = req.round_idx
        rounds = sess.session.rounds
        # Observable: the response ended, with these tool calls (none: the session waits on its user,
        # which is also how a session that has ended looks to an engine).
        sess.out_since = self.loop.now
        sess.out_tools = req.tools
        if k + 1 < len(rounds):
            sess.next_round = k + 1
            self.loop.at(next_ready_s(sess.session, k, self.loop.now), self._ready, sess)
        else:
            sess.done = True
            self.live_sessions -= 1

    # --- running ---------------------------------------------------------------------------
    def _sample(self, progress: Callable[[float], None] | None) -> None:
        now = self.loop.now
        rec = self.recorder.samples
        rec["t_s"].append(now)
        rec["live_sessions"].append(self.live_sessions)
        rec["hbm_used_frac"].append(sum(w.hbm.used for w in self.workers) / (self.tiers.hbm_chunks * len(self.workers)))
        rec["waiting"].append(sum(len(w.waiting) for w in self.workers))
        rec["running"].append(sum(len(w.running) for w in self.workers))
        if progress is not None:
            progress(min(now / self.horizon, 1.0))
        if now + self.config.sample_every_s <= self.horizon and not self._done() and len(self.loop) > 0:
            self.loop.at(now + self.config.sample_every_s, lambda _: self._sample(progress))

    def _done(self) -> bool:
        return self.loop.now >= self.window.end_s and self.open_measured == 0

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        t0 = time.perf_counter()
        for sess in self.sessions:
            first = sess.session.rounds[0]
            self.loop.at(first.at_s if first.at_s is not None else sess.session.start_s, self._start_session, sess)
        self.loop.at(0.0, lambda _: self._sample(progress))
        self.loop.run(until=self.horizon, stop=self._done)
        self.wall_s = time.perf_counter() - t0
        return SimResult(self)


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
                "resumed_paths": {k: v / resumed for k, v in sorted(paths.items())},
                "shadow": self.shadow_block(),
                "ingress": ({"policy": cfg.ingress, "decisions": dict(sorted(sim.ingress.decisions.items())),
                             "deferred": sum(r["deferred"] for r in self.records if r["measured"])} if sim.ingress else None),
                "window_s": [sim.window.start_s, sim.window.end_s],
                "config": self.config_block(),
            }
        )
        return out

    def shadow_block(self) -> dict[str, Any]:
        """How often a shadow policy, on the same snapshots in the measurement window, would have decided
        differently: over admission choices (the shadow admitting another request or none) and
        over routing decisions."""
        sim, cfg = self.sim, self.sim.config
        out: dict[str, Any] = {}
        if cfg.shadow_state:
            n = sum(w.shadow_decisions for w in sim.workers)
            d = sum(w.shadow_differs for w in sim.workers)
            out["state"] = {"policy": cfg.shadow_state, "decisions": n, "differs": d, "differs_frac": d / n if n else None}
        if cfg.shadow_router:
            n, d = sim.router_shadow["decisions"], sim.router_shadow["differs"]
            out["router"] = {"policy": cfg.shadow_router, "decisions": n, "differs": d, "differs_frac": d / n if n else None}
        return out

    def config_block(self) -> dict[str, Any]:
        sim = self.sim
        p = sim.preset
        return {
            **sim.config.model_dump(),
            "preset": {"router": p.router, "state": p.state, "execution": p.execution, "eviction": p.eviction, "description": p.description},
            "tiers": sim.tiers.describe(),
            "profile": {"name": sim.profile.name, "kind": sim.profile.kind, "description": sim.profile.description},
            "workload": {k: v for k, v in sim.workload.meta.items() if k != "choices"} | {"sessions": len(sim.workload.sessions), "requests": sim.workload.num_requests},
            "slo": sim.config.slo.model_dump(),
        }

    def occupancy(self) -> dict[str, list[float]]:
        return self.sim.recorder.samples
