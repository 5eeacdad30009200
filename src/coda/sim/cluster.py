"""A cluster of simulated workers behind a router, driven by closed-loop agent sessions.

A session's next round becomes ready when its previous round completes plus the tool time (or
user think time) that followed it; open-loop rounds (``at_s``) are ready at their timestamp, but
never before the previous round of their session completed. ``Simulation`` runs the sessions and
the simulated gateway's decisions; its parts are the tier sizes (``coda.sim.tiers``), the chunk
ids of each prompt (``coda.sim.chains``), the gateway's views of the workers (``coda.sim.views``),
the workers themselves (``coda.sim.worker``) and the report (``coda.sim.results``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from coda.cost.expert_parallel import ExpertParallelGroup
from coda.cost.model import CostModel, build_cost_model
from coda.cost.operators import OperatorCost
from coda.cost.profile import load_profile
from coda.errors import CodaError
from coda.metrics.requests import Window
from coda.policy.presets import system_preset
from coda.policy.snapshots import IngressSnapshot, PrefixMatch, RouteRequest, RoutingSnapshot, WorkerLoad
from coda.shell.build import PolicySet, build_policies
from coda.shell.estimates import ttft_estimate
from coda.shell.kvindex import KVIndexer, WorkerTiers
from coda.sim.chains import ChunkChains
from coda.sim.config import SimConfig
from coda.sim.ingress import SIM_SIGNALS, SimIngress
from coda.sim.kvcache import HbmPool, IdleRuns, KVListener, KVStore, Residency, Versions, owners_of
from coda.sim.lockstep import Lockstep
from coda.sim.loop import EventLoop
from coda.sim.observe import SimObserver
from coda.sim.recorder import Recorder
from coda.sim.request import REJECTED, SessionState, SimRequest
from coda.sim.results import SimResult
from coda.sim.tiers import resolve_tiers
from coda.sim.views import ClusterViews
from coda.sim.worker import NodeLinks, Worker, WorkerSettings
from coda.workload.schema import Workload, next_ready_s, reused_prefix_of, unsent_ready_s
from coda.workload.stats import workload_duration_s


def data_parallel_groups(config: SimConfig, cost: CostModel, loop: EventLoop) -> list[Lockstep | None]:
    """Each worker's lockstep group: ``data_parallel_size`` consecutive workers are the ranks of one
    data-parallel group; with expert parallelism they share one (without it they are independent
    engines, as a dense model's data-parallel ranks are)."""
    dp = config.data_parallel_size
    if config.workers % dp:
        raise CodaError(f"workers={config.workers} is not a multiple of data_parallel_size={dp}; each worker is one rank of a group")
    if not config.enable_expert_parallel:
        return [None] * config.workers
    if not isinstance(cost, OperatorCost):
        raise CodaError(f"enable_expert_parallel: profile {cost.profile.name} is a {cost.profile.kind} profile; "
                        "expert parallelism needs an operators profile")
    group = ExpertParallelGroup(cost, dp)
    steps = [Lockstep(loop, group) for _ in range(config.workers // dp)]
    return [steps[w // dp] for w in range(config.workers)]


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
        self.policies: PolicySet = build_policies(config.policy_spec, self.cost)
        for shadowed in self.policies.shadows().values():
            shadowed.window = (self.window.start_s, self.window.end_s)
        self.router = self.policies.router
        self.observers = tuple(observers)
        self.worker_fields = self.router.worker_fields.union(*(ob.worker_fields for ob in self.observers))
        self.eviction = self.policies.eviction
        self.ingress = self._ingress(config)
        self.ttft_estimates: list[float | None] = [None] * config.workers
        self._owner_session: dict[int, SessionState] = {}

        # locations: an HBM pool per worker and at most a DRAM and an SSD store per worker
        self.residency = Residency()
        self.views = ClusterViews(
            C, self.worker_fields, self.ingress, KVIndexer(max_locations=3 * config.workers) if config.indexer else None, self.residency
        )
        if self.views.indexer is not None:
            kv_listener = self.views.indexing(kv_listener)
        wpn = 1 if self.tiers.per_worker else self.profile.tiers.workers_per_node
        n_stores = math.ceil(config.workers / wpn)
        res = self.residency
        self.ssd_stores = [
            KVStore("ssd", i, self.tiers.ssd_chunks, self.versions, listener=kv_listener, residency=res) if self.tiers.ssd else None
            for i in range(n_stores)
        ]
        self.dram_stores = [
            KVStore("dram", i, self.tiers.dram_chunks, self.versions, lower=self.ssd_stores[i], listener=kv_listener, residency=res)
            if self.tiers.dram
            else None
            for i in range(n_stores)
        ]
        links = [NodeLinks() for _ in range(n_stores)]
        settings = WorkerSettings(
            loop=self.loop,
            cost=self.cost,
            versions=self.versions,
            state_policy=self.policies.state,
            execution=self.policies.execution,
            recorder=self.recorder,
            on_finish=self._finished,
            chunk_tokens=C,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            decode_run_max=config.decode_run_max,
            cpu_shadow=self.tiers.cpu_shadow,
            observers=self.observers,
            on_first_token=self._first_token,
            on_admit=self._engine_admitted,
        )
        groups = data_parallel_groups(config, self.cost, self.loop)
        # a policy that reads the LRU by owner gets it as runs, which the pools keep as it changes
        run_evictor = self._victims_by_runs if hasattr(self.eviction, "victims_by_runs") else None
        self.workers = [
            Worker(
                w,
                settings,
                HbmPool(w, self.tiers.hbm_chunks, self.versions, kv_listener, self._victims, self.residency, run_evictor),
                self.dram_stores[w // wpn],
                self.ssd_stores[w // wpn],
                links[w // wpn],
                touched=self.views.touched,
                lockstep=groups[w],
            )
            for w in range(config.workers)
        ]
        self.views.attach(
            self.workers,
            [
                WorkerTiers(w, f"hbm:{w}", f"dram:{w // wpn}" if self.tiers.dram else None, f"ssd:{w // wpn}" if self.tiers.ssd else None)
                for w in range(config.workers)
            ],
        )
        self.chains = ChunkChains(workload, C, self.versions)
        self.sessions = [SessionState(i, s, self.versions.new_owner()) for i, s in enumerate(workload.sessions)]
        self._owner_session.update((sess.owner, sess) for sess in self.sessions)
        self.requests: list[SimRequest] = []
        self._route_seq = 0
        self._retry_pending = False
        self.live_sessions = 0
        self.open_measured = 0
        self.wall_s = 0.0

    def _ingress(self, config: SimConfig) -> SimIngress:
        """The simulated gateway's admission (every request passes it, as every request passes ``coda serve``)."""
        policy, spec = self.policies.ingress, self.policies.spec.ingress
        missing = sorted(policy.signals - SIM_SIGNALS)
        if missing:
            raise CodaError(f"ingress policy {spec.name} needs {', '.join(missing)}, which the simulator cannot supply")
        return SimIngress(policy, spec.defer, config.tenants)

    def _victims(self, lru: Any, n: int) -> list[int]:
        return self.eviction.victims(lru, n, self._out_status, owners_of)

    def _victims_by_runs(self, runs: IdleRuns, n: int) -> list[int]:
        return self.eviction.victims_by_runs(runs, len(runs), n, self._out_status)  # type: ignore[attr-defined]

    def _out_status(self, owner: int) -> tuple[tuple[str, ...], float] | None:
        """What a shell observes of the session owning a chunk: the tools it waits on and for how
        long, while its last response has ended and its next request has not come (``None`` otherwise)."""
        sess = self._owner_session.get(owner)
        if sess is None or sess.out_since is None:
            return None
        return sess.out_tools, self.loop.now - sess.out_since

    def oracle_remaining_s(self, owner: int) -> float:
        """The true time until the session owning a chunk sends its next request (infinite once it
        has ended; 0 while it is not out). Hidden from every policy: for oracle experiments only."""
        sess = self._owner_session.get(owner)
        if sess is None or sess.out_since is None:
            return 0.0
        if sess.done:
            return math.inf
        rnd = sess.session.rounds[sess.next_round - 1]
        return max(sess.out_since + rnd.tool_duration_s + rnd.think_time_s - self.loop.now, 1e-9)

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
        self.largest_request_tokens = largest
        need = -(-(largest + 1) // C)
        if need > self.tiers.hbm_chunks:
            raise CodaError(
                f"HBM holds {self.tiers.hbm_chunks} chunks of {C} tokens but the workload's largest request needs {need}; "
                "raise hbm_kv_gib or use a profile with more KV memory"
            )

    # --- sessions --------------------------------------------------------------------------
    def _start_session(self, sess: SessionState) -> None:
        self.live_sessions += 1
        self._ready(sess)

    def _ready(self, sess: SessionState) -> None:
        now = self.loop.now
        if sess.out_since is not None:
            self.eviction.observe(sess.out_tools, now - sess.out_since)
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
        req.chain, req.owners = self.chains.chain(sess, k, prefix, prompt)
        req.tools = tuple(t.name for t in rnd.tools)
        req.measured = self.window.start_s <= now <= self.window.end_s
        self.open_measured += req.measured
        self.requests.append(req)
        if self.ingress is None:
            self.workers[self._route(req, sess)].enqueue(req)
        else:
            self._admit_or_not(req)

    # --- ingress ---------------------------------------------------------------------------
    def ingress_snapshot(self, req: SimRequest) -> IngressSnapshot:
        """What the ingress policy sees of an arriving (or held) request and the workers."""
        ing = self.ingress
        assert ing is not None
        signals = ing.policy.signals
        hit = 0.0
        match: Callable[[int], PrefixMatch | None]
        if "prefix_hit" in signals or "queue_age" in signals:
            matches = self.views.matches(req.chain, req.owners)
            if "prefix_hit" in signals:
                best = max((m.hbm_blocks + m.dram_blocks + m.ssd_blocks for m in matches.values()), default=0)
                hit = best / max(len(req.chain), 1)
            match = matches.get
        else:  # a worker's match probed only if the policy reads its load (most read none, or the chosen one's)
            match = self.views.match_reader(req.chain, req.owners)
        now = self.loop.now
        loads: Sequence[WorkerLoad]
        if "queue_age" in signals:
            loads = tuple(
                dataclasses.replace(w, new_tokens=self._new_tokens(req, match(w.worker_id)), queue_age_s=ing.queue_age_s(w.worker_id, now))
                for w in self.views.loads()
            )
        else:  # each worker's load built as the policy reads it
            loads = self.views.arrival_loads(match, req.orig_prompt_tokens)
        return ing.snapshot(now, req, self._tenant(req), loads, hit, self.ttft_estimates)

    def _new_tokens(self, req: SimRequest, match: PrefixMatch | None) -> int:
        """``WorkerLoad.new_tokens``: the prompt beyond its leading run resident in the worker's HBM."""
        return req.orig_prompt_tokens - (match.hbm_blocks * self.C if match is not None else 0)

    @staticmethod
    def _tenant(req: SimRequest) -> str:
        return req.sess.session.tenant or "default"

    def _admit_or_not(self, req: SimRequest) -> None:
        """Decide on a request at its arrival, and again each time a held one is retried."""
        ing = self.ingress
        assert ing is not None
        snap = self.ingress_snapshot(req)
        d = ing.decide(snap, req.rid)
        if d.action == "admit":
            ing.release(req)
            wid = self._route(req, req.sess)
            req.ingress_tokens = snap.workers[wid].new_tokens
            ing.admitted(req, wid, self._tenant(req), self.loop.now)
            self.views.touched.add(wid)
            self.workers[wid].enqueue(req)
        elif d.action == "defer":
            if req.deferred_since >= 0:
                return  # held already: its deadline event stands
            req.deferred_since = self.loop.now
            if not ing.hold(req, snap.session_active):
                ing.liveness.done(req.rid)
                self._reject(req, "gateway_queue_full")
                return
            self.loop.at(self.loop.now + ing.defer.max_wait_s, self._defer_timeout, req)
        else:
            ing.release(req)
            self._reject(req, d.reason)

    def _defer_timeout(self, req: SimRequest) -> None:
        """A held request that found no room within max_wait_s: answered 503 with Retry-After."""
        assert self.ingress is not None
        if self.ingress.release(req):
            self.ingress.liveness.done(req.rid)
            self._reject(req, "defer_timeout")

    def _room_may_have_freed(self) -> None:
        """An engine admitted or finished a request: held requests decide again (at this instant, as
        the gateway's deferred requests wake on its next event-loop turn)."""
        if self.ingress is not None and self.ingress.deferred and not self._retry_pending:
            self._retry_pending = True
            self.loop.at(self.loop.now, self._retry_deferred)

    def _retry_deferred(self, _: object) -> None:
        self._retry_pending = False
        assert self.ingress is not None
        self.ingress.retry_all(self.loop.now, self._admit_or_not)

    def _engine_admitted(self, req: SimRequest) -> None:
        self._room_may_have_freed()

    def _first_token(self, req: SimRequest) -> None:
        """A worker's TTFT estimate (the ``deadline`` policy's prediction) learns from each first token."""
        self.ttft_estimates[req.worker] = ttft_estimate(self.ttft_estimates[req.worker], req.first_token_s - req.arrived_s)
        if self.ingress is not None:
            self.ingress.answered(req)
            self._room_may_have_freed()  # its queue got younger

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

    def routing_snapshot(self, req: SimRequest) -> RoutingSnapshot:
        """What the router (and the observers) may see of a request to place and the workers."""
        rr = RouteRequest(
            seq=self._route_seq,
            session_id=req.sess.session.session_id,
            is_continuation=req.round_idx > 0,  # the previous round completed: a round is sent only after it
            prompt_tokens=req.prompt_tokens,
            prompt_blocks=len(req.chain),
        )
        return self.views.routing_snapshot(self.loop.now, rr, req.chain, req.owners)

    def _route(self, req: SimRequest, sess: SessionState) -> int:
        snap = self.routing_snapshot(req)
        self._route_seq += 1
        wid = self.router.route(snap)
        for ob in self.observers:
            ob.on_route(snap, wid)
        if not 0 <= wid < len(self.workers):
            raise AssertionError(f"router {self.router.name} chose worker {wid} outside 0..{len(self.workers) - 1}")
        return wid

    def _finished(self, req: SimRequest) -> None:
        sess = req.sess
        if self.ingress is not None:
            self.ingress.finished(req, self._tenant(req))
            self.views.touched.add(req.worker)
            self._room_may_have_freed()
        sess.context_tokens = req.orig_prompt_tokens + req.output_tokens
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
