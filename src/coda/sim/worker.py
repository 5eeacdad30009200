"""One simulated engine worker: a vLLM-like iteration scheduler over a chunked HBM KV pool.

Each step: running requests first (decodes take one token, partial prefills the rest of the
token budget), then, if nothing was preempted, waiting requests in the state-admission policy's
order while seats and budget last. A request admitted with part of its prefix in DRAM or on SSD
holds its HBM chunks and a seat while its transfer runs on the worker's H2D link (queued behind
earlier transfers), then joins the running set. Decode growth that does not fit preempts the
newest running request (recompute), as vLLM does. With W_max preemption (``TieredAging``'s
``preempt``), each step first preempts running requests for the oldest waiting request once it has
waited W_max and does not fit or has no seat (``coda.policy.state.preemption_victims``), as
``CodaScheduler`` does before vLLM's own step.

Runs of pure-decode steps whose batch membership cannot change (nothing admissible, no prefill)
are advanced together: their durations come from ``cost.decode_steps_s`` in one call, and an
arrival or finished transfer interrupts the run at the next step boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from coda.cost.host import HostModel, Serving
from coda.cost.model import CohortPlan, CostModel
from coda.policy.contracts import ExecutionPolicy, StatePolicy
from coda.policy.snapshots import AdmissionSnapshot
from coda.policy.state import overdue, preemption_victims, w_max_of
from coda.sim.kvcache import HbmPool, KVStore, Versions
from coda.sim.lockstep import Lockstep
from coda.sim.loop import EventLoop
from coda.sim.observe import SimObserver
from coda.sim.request import RESTORING, RUNNING, WAITING, SimRequest

if TYPE_CHECKING:
    from coda.sim.recorder import Recorder


class NodeLinks:
    """Links shared by the workers of a node (the SSD read queue)."""

    __slots__ = ("ssd_busy",)

    def __init__(self) -> None:
        self.ssd_busy = 0.0


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What every worker of a cluster shares: the engine's scheduler limits (vLLM's flags), the
    policies it runs, the clock and cost model, and the shell's hooks into its events."""

    loop: EventLoop
    cost: CostModel
    versions: Versions
    state_policy: StatePolicy
    execution: ExecutionPolicy
    recorder: Recorder
    on_finish: Callable[[SimRequest], None]
    chunk_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    decode_run_max: int
    cpu_shadow: bool
    observers: tuple[SimObserver, ...] = ()
    on_first_token: Callable[[SimRequest], None] | None = None
    on_admit: Callable[[SimRequest], None] | None = None
    serving: Serving = field(default_factory=Serving)  # the workers taking steps now: they share the machine's cores


class Worker:
    def __init__(self, wid: int, settings: WorkerSettings, hbm: HbmPool, dram: KVStore | None, ssd: KVStore | None, links: NodeLinks,
                 touched: set[int] | None = None, lockstep: Lockstep | None = None) -> None:
        """Worker ``wid`` with its own HBM pool, the node's DRAM and SSD stores and links, and the
        cluster's ``settings``; ``touched`` is the cluster's set of workers whose views changed;
        ``lockstep``: the data-parallel group with expert parallelism whose steps this rank shares."""
        st = settings
        self.id = wid
        self.settings = st
        self.loop = st.loop
        self.cost = st.cost
        self.hbm = hbm
        self.dram = dram
        self.ssd = ssd
        self.links = links
        self.versions = st.versions
        self.state_policy = st.state_policy
        self.execution = st.execution
        self.recorder = st.recorder
        self.on_finish = st.on_finish
        self.C = st.chunk_tokens
        self.max_num_seqs = st.max_num_seqs
        self.budget = st.max_num_batched_tokens
        self.run_max = st.decode_run_max
        self.cpu_shadow = st.cpu_shadow
        self.observers = st.observers
        self.on_first_token = st.on_first_token
        self.on_admit = st.on_admit
        self.frontier = st.state_policy.frontier
        self.w_max_s, self.w_max_preempt = w_max_of(st.state_policy)
        self.w_max_admissions = 0  # admissions of requests that had waited W_max
        self.w_max_preemptions = 0  # running requests preempted for them
        self.chunk_bytes = st.cost.kv_bytes(st.chunk_tokens)
        self.host = HostModel.of(st.cost.profile)
        self.host_backlog_s = 0.0  # host CPU of requests that arrived while steps ran, charged to the next batch

        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.n_restoring = 0
        self.active_tokens = 0  # prompt + generated tokens of the active requests (running, restoring, waiting)
        self.h2d_busy = 0.0
        self.d2h_busy = 0.0
        self._admit_seq = 0
        # current batch
        self.busy = False
        self._kick_pending = False
        self._gen = 0
        self._prefills: list[tuple[SimRequest, int]] = []
        self._decoders: list[SimRequest] = []
        self._plan: CohortPlan | None = None
        self._ctx: np.ndarray = np.empty(0, dtype=np.int64)
        self._start = 0.0
        self._ends: np.ndarray = np.empty(0)
        self._k = 0
        self.steps = 0
        self.decode_steps = 0
        # Ids of workers whose events may have changed what a router or ingress view reads
        # (queues, active tokens, decode contexts, HBM use), shared by a cluster's workers so it
        # rebuilds only those views. Callbacks out of these events defer routing to the loop, so
        # no view is taken mid-event.
        self.touched = touched if touched is not None else set()
        self.lockstep = lockstep

    # --- views -----------------------------------------------------------------------------
    @property
    def active_requests(self) -> int:
        return len(self.running) + self.n_restoring + len(self.waiting)

    def decode_contexts(self) -> tuple[int, ...]:
        """Contexts of the requests decoding now: prompt and generated tokens (the KV they attend to)."""
        return tuple(r.computed + 1 for r in self.running if r.computed >= r.prompt_tokens)

    # --- arrivals --------------------------------------------------------------------------
    def enqueue(self, req: SimRequest) -> None:
        """A request reaches the engine; its scheduler sees it after the engine's own per-request
        time (``cost.request_s``: the API server's work, with the requests running now), when the
        profile measured one; arriving while steps run, its host CPU also delays the next batch (``HostModel``)."""
        self.touched.add(self.id)
        if self.host is not None and self.busy:
            self.host_backlog_s += self.host.arrival_s(req.prompt_tokens)
        req.worker = self.id
        req.state = WAITING
        if req.arrived_s < 0:
            req.arrived_s = self.loop.now
        self.active_tokens += req.orig_prompt_tokens + req.emitted
        delay = self.cost.request_s(req.prompt_tokens, len(self.running))
        if delay > 0:
            self.loop.at(self.loop.now + delay, self._arrive, req)
        else:
            self._arrive(req)

    def _arrive(self, req: SimRequest) -> None:
        self.touched.add(self.id)
        self.waiting.append(req)
        self.kick()

    def abort(self, req: SimRequest) -> bool:
        """Stop a request as an engine's abort does: a waiting one leaves the queue now (returns
        True); a running or restoring one ends after its current step, freeing its KV then."""
        self.touched.add(self.id)
        if req.state == WAITING and req in self.waiting:
            self.waiting.remove(req)
            self.active_tokens -= req.orig_prompt_tokens + req.emitted
            return True
        req.output_tokens = min(req.output_tokens, req.emitted + 1)
        return False

    def kick(self) -> None:
        """Something changed: start a step if idle, else end a decode run at its next boundary."""
        if not self.busy:
            if not self._kick_pending:
                self._kick_pending = True
                self.loop.at(self.loop.now, self._kicked)
        elif self._k > 1:
            now = self.loop.now
            i = int(np.searchsorted(self._ends, now, side="left"))
            if i < self._k - 1:
                self._k = i + 1
                self._gen += 1
                self.loop.at(float(self._ends[i]), self._step_end, self._gen)

    def _kicked(self, _: object) -> None:
        self._kick_pending = False
        if not self.busy:
            self._schedule()

    # --- admission -------------------------------------------------------------------------
    def _match(self, req: SimRequest) -> tuple[int, int, int, int]:
        """(HBM hits, idle HBM hits, DRAM hits, SSD hits) in chunks, cached until residency changes."""
        v = self.versions.v
        key = (self.id, *[v[o] for o in req.owners])
        if req.match_key == key:
            return req.match
        chain = req.chain
        h, idle = self.hbm.leading_hits(chain)
        d = self.dram.leading(chain, h) if self.dram is not None else 0
        s = self.ssd.leading(chain, h + d) if self.ssd is not None else 0
        req.match_key = key
        req.match = (h, idle, d, s)
        return req.match

    def _plan_hits(self, req: SimRequest) -> tuple[int, int, int, int, int]:
        """Usable hits (h, idle, d, s) capped so at least the prompt's last token is computed, and extra chunks."""
        h, idle, d, s = self._match(req)
        cap = (req.prompt_tokens - 1) // self.C
        if h + d + s > cap:
            s = max(0, min(s, cap - h - d))
            d = max(0, min(d, cap - h))
            if h > cap:
                idle = min(idle, cap)
                h = cap
        # the prompt's blocks: the first output token's slot comes with the first decode step, as in vLLM
        total = -(-req.prompt_tokens // self.C)
        return h, idle, d, s, total - h

    def _row(self, req: SimRequest) -> tuple[int, float, int, int, int, int, int, bool]:
        h, idle, d, s, extra = self._plan_hits(req)
        C = self.C
        return (req.rid, req.arrived_s, req.prompt_tokens, h * C, d * C, s * C, extra, extra <= self.hbm.reclaimable - idle)

    def snapshot(self) -> AdmissionSnapshot:
        """What the state-admission policy (and its shadow) may see: the oldest-ready frontier."""
        now = self.loop.now
        return AdmissionSnapshot.from_rows(
            now,
            [self._row(r) for r in self.waiting[: self.frontier]],
            free_blocks=self.hbm.reclaimable,
            h2d_outstanding_s=max(0.0, self.h2d_busy - now),
            ssd_outstanding_s=max(0.0, self.links.ssd_busy - now),
        )

    def _decide(self) -> int | None:
        snap = self.snapshot()
        idx = self.state_policy.choose(snap)
        for ob in self.observers:
            ob.on_admission(self.id, snap, idx)
        return idx

    def _admit(self, req: SimRequest) -> None:
        now = self.loop.now
        C = self.C
        h, idle, d, s, extra = self._plan_hits(req)
        if extra > self.hbm.reclaimable - idle:
            raise AssertionError(f"policy admitted request {req.rid}, which does not fit in HBM")
        chain = req.chain
        self.hbm.acquire(chain[:h])
        evicted = self.hbm.make_room(extra)
        self.hbm.insert(chain[h:])
        req.held = len(chain)
        req.private = extra - (len(chain) - h)
        self.hbm.private += req.private
        self.waiting.remove(req)
        if self.w_max_s is not None and now - req.arrived_s >= self.w_max_s:
            self.w_max_admissions += 1
        self._admit_seq += 1
        req.admit_seq = self._admit_seq
        req.admitted_s = now
        req.computed = min((h + d + s) * C, req.prompt_tokens - 1)
        if req.hbm_hit < 0:  # first admission decides the preparation path
            req.hbm_hit, req.dram_hit, req.ssd_hit = h * C, d * C, s * C
            reusable_chunks = req.reused_tokens // C
            if req.round_idx == 0 and reusable_chunks == 0:
                req.path = "cold"
            elif h + d + s < min(reusable_chunks, (req.prompt_tokens - 1) // C):
                req.path = "recompute"
            elif s:
                req.path = "ssd"
            elif d:
                req.path = "dram"
            else:
                req.path = "hbm"
        ready = now
        if d and self.dram is not None:  # before the SSD part joins DRAM, which evicts its least recently used chunks
            self.dram.touch(chain[h : h + d])
        if s and self.ssd is not None:
            ssd_part = chain[h + d : h + d + s]
            done = max(now, self.links.ssd_busy) + self.cost.ssd_read_s(s * self.chunk_bytes)
            self.links.ssd_busy = done
            ready = done
            if self.dram is not None:
                self.dram.put(ssd_part)
        if d or s:
            start = max(ready, self.h2d_busy)
            self.h2d_busy = start + self.cost.h2d_s((d + s) * self.chunk_bytes)
            ready = self.h2d_busy
        ready = max(ready, self._copy_out(evicted))
        req.state_ready_s = ready
        if ready > now:
            req.state = RESTORING
            self.n_restoring += 1
            self.loop.at(ready, self._restored, req)
        else:
            req.state = RUNNING
            self.running.append(req)
        if self.on_admit is not None:
            self.on_admit(req)

    def _restored(self, req: SimRequest) -> None:
        self.touched.add(self.id)
        self.n_restoring -= 1
        req.state = RUNNING
        self.running.append(req)
        self.kick()

    # --- KV growth and preemption ----------------------------------------------------------
    def _grow(self, req: SimRequest, tokens_after: int) -> bool:
        need = -(-tokens_after // self.C) - req.held - req.private
        if need <= 0:
            return True
        if need > self.hbm.reclaimable:
            return False
        self._copy_out(self.hbm.make_room(need))
        req.private += need
        self.hbm.private += need
        return True

    def _copy_out(self, evicted: list[int]) -> float:
        """Without the CPU shadow, evicted chunks are copied to DRAM before their HBM is reused (on
        the D2H link, behind earlier copies); returns when the copy ends (now if nothing to copy).
        An admission waits for it; a decode step's growth does not (its new block is written last)."""
        now = self.loop.now
        if not evicted or self.cpu_shadow or self.dram is None:
            return now
        self.d2h_busy = max(now, self.d2h_busy) + self.cost.d2h_s(len(evicted) * self.chunk_bytes)
        self.dram.put(evicted)
        return self.d2h_busy

    def _release(self, req: SimRequest) -> None:
        """Free a request's chunks: computed ones stay cached, uncomputed ones are dropped."""
        done = min(req.computed // self.C, req.held)
        self.hbm.release(req.chain[:done])
        if req.held > done:
            self.hbm.discard(req.chain[done : req.held])
        self.hbm.private -= req.private
        req.held = req.private = 0

    def _preempt(self, victim: SimRequest) -> None:
        """Recompute preemption: the request returns to the front of the queue with its output so far."""
        self.running.remove(victim)
        self._seal_output(victim)
        self._release(victim)
        if victim.emitted:
            # Its generated tokens become part of the prompt to recompute.
            victim.prompt_tokens = victim.orig_prompt_tokens + victim.emitted
            full = victim.prompt_tokens // self.C
            if full > len(victim.chain):
                victim.chain = victim.chain + victim.sess.fresh_ids(full - len(victim.chain))
        victim.computed = 0
        victim.state = WAITING
        victim.preemptions += 1
        victim.match_key = None
        self.waiting.insert(0, victim)

    def _overdue(self) -> int | None:
        """The index of the waiting request W_max preemption serves (among the policy's frontier), if any."""
        return overdue(self.loop.now, [r.arrived_s for r in self.waiting[: self.frontier]], self.w_max_s)  # type: ignore[arg-type]

    def _preempt_for_overdue(self) -> None:
        """W_max preemption: once the oldest waiting request has waited W_max and lacks blocks or a
        seat, preempt running requests in the policy core's order until it has both."""
        i = self._overdue()
        if i is None:
            return
        req = self.waiting[i]

        def seat_needed() -> bool:
            return len(self.running) + self.n_restoring >= self.max_num_seqs

        if self._row(req)[-1] and not seat_needed():
            return
        _, idle, _, _, extra = self._plan_hits(req)
        mine = set(req.chain)
        res = self.hbm.resident
        # blocks each preemption frees: its private ones and those only it holds, other than the overdue request's own hits
        rows = [(r.arrived_s, r.private + sum(1 for c in r.chain[: r.held] if res[c] == 1 and c not in mine)) for r in self.running]
        victims = [self.running[j] for j in preemption_victims(req.arrived_s, extra - (self.hbm.reclaimable - idle), seat_needed(), rows)]
        for victim in victims:
            if self._row(req)[-1] and not seat_needed():
                break
            self._preempt(victim)
            self.w_max_preemptions += 1

    # --- the step --------------------------------------------------------------------------
    def _schedule(self) -> None:
        self.touched.add(self.id)
        if self.w_max_preempt and self.waiting:
            self._preempt_for_overdue()
        budget = self.budget
        prefills: list[tuple[SimRequest, int]] = []
        decoders: list[SimRequest] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            if r.computed < r.prompt_tokens:
                n = min(r.prompt_tokens - r.computed, budget)
                prefills.append((r, n))
                budget -= n
                i += 1
                continue
            while not self._grow(r, r.computed + 1):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r.state != RUNNING:
                break
            decoders.append(r)
            budget -= 1
            i += 1
        admissible_later = True
        if not preempted:
            promote_one = self.state_policy.admission == "promote_one"
            asked = False
            while budget > 0 and self.waiting and len(self.running) + self.n_restoring < self.max_num_seqs:
                if promote_one and asked:  # the policy promoted one request; the engine's FCFS admits the rest
                    head = (self._overdue() if self.w_max_preempt else None) or 0  # with preempt, an overdue request first
                    idx = head if self._row(self.waiting[head])[-1] else None
                else:
                    idx = self._decide()
                    asked = True
                if idx is None:
                    admissible_later = False
                    break
                req = self.waiting[idx]
                self._admit(req)
                if req.state == RUNNING:
                    n = min(req.prompt_tokens - req.computed, budget)
                    prefills.append((req, n))
                    budget -= n
            else:
                admissible_later = bool(self.waiting) and len(self.running) + self.n_restoring < self.max_num_seqs
        if not prefills and not decoders:
            self._serve(False)
            self._k = 0
            return
        self._serve(True)
        k = 1
        ctx = np.fromiter((r.computed + 1 for r in decoders), dtype=np.int64, count=len(decoders))
        chunks = [(n, r.computed) for r, n in prefills]
        self._prefills, self._decoders, self._plan, self._ctx = prefills, decoders, None, ctx
        if self.lockstep is not None:  # one step at a time, timed with the group's other ranks
            self.lockstep.ready(self, chunks, ctx)
            return
        if not prefills:
            plan = self._plan = self.execution.plan(ctx)
            if not admissible_later:
                k = self._run_length(decoders, ctx)
            durs = self.cost.decode_steps_s(ctx, k, plan)
        else:
            durs = np.array([self.cost.step_s(chunks, ctx, None)])
        if self.host is not None:
            outputs = len(decoders) + sum(r.computed + n >= r.prompt_tokens for r, n in prefills)
            durs = self.host.steps_s(durs, outputs, self.host_backlog_s, self.settings.serving.count)
            self.host_backlog_s = 0.0
        ends = self.loop.now + np.cumsum(durs)
        if len(ends) > 1 and self.w_max_preempt and self.waiting:
            # the oldest waiting request's W_max ends a decode run at the next step boundary, where it may preempt
            deadline = min(r.arrived_s for r in self.waiting) + self.w_max_s  # type: ignore[operator]
            if deadline < ends[-1]:
                self.loop.at(deadline, self._wake)
        self.launch(ends)

    def _wake(self, _: object) -> None:
        self.kick()

    def _serve(self, busy: bool) -> None:
        """Mark this worker taking steps or idle, and count it among the machine's serving workers."""
        if busy != self.busy:
            self.settings.serving.count += 1 if busy else -1
        self.busy = busy

    def launch(self, ends: np.ndarray) -> None:
        """Run the batch fixed by ``_schedule`` now as ``len(ends)`` steps ending at ``ends``."""
        self._start = self.loop.now
        self._ends = ends
        self._k = k = len(ends)
        self._gen += 1
        self.loop.at(float(ends[k - 1]), self._step_end, self._gen)

    def _run_length(self, decoders: list[SimRequest], ctx: np.ndarray) -> int:
        """Steps the batch can run unchanged: until the first finish, within free KV, at most ``run_max``."""
        k = min(self.run_max, min(r.output_tokens - r.emitted for r in decoders))
        if k <= 1:
            return 1
        held = np.fromiter((r.held + r.private for r in decoders), dtype=np.int64, count=len(decoders))
        comp = ctx - 1
        C = self.C

        def need(steps: int) -> int:
            return int(np.maximum(-(-(comp + steps) // C) - held, 0).sum())

        avail = self.hbm.reclaimable
        if need(k) > avail:
            lo, hi = 1, k  # need(lo) fits (ensured by _grow), need(hi) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if need(mid) <= avail:
                    lo = mid
                else:
                    hi = mid
            k = lo
        for r in decoders:
            self._grow(r, r.computed + k)
        return k

    def _step_end(self, gen: int) -> None:
        if gen != self._gen:
            return
        self.touched.add(self.id)
        now = self.loop.now
        k = self._k
        ends = self._ends[:k]
        durs = np.diff(ends, prepend=self._start)
        for ob in self.observers:
            ob.on_step(self.id, self._start, durs, [(n, r.computed) for r, n in self._prefills], self._ctx, self._plan)
        finished: list[SimRequest] = []
        for r, n in self._prefills:
            r.computed += n
            if r.computed >= r.prompt_tokens:
                if self.cpu_shadow and self.dram is not None:
                    self.dram.put(r.chain[: r.held])
                first = r.emitted == 0
                if first:
                    r.first_token_s = now
                else:
                    gap = now - r.last_token_s
                    r.tbt_max = max(r.tbt_max, gap)
                    self.recorder.gap(r, gap)
                r.emitted += 1
                self.active_tokens += 1
                r.last_token_s = now
                if first and self.on_first_token is not None:
                    self.on_first_token(r)
                if r.emitted >= r.output_tokens:
                    finished.append(r)
        decoders = self._decoders
        if decoders:
            self.decode_steps += k if not self._prefills else 0
            dmax = float(durs.max())
            self.active_tokens += k * len(decoders)
            for r in decoders:
                r.computed += k
                r.emitted += k
                r.last_token_s = now
                if dmax > r.tbt_max:
                    r.tbt_max = dmax
                if self._plan is not None:
                    r.cohort_steps += k
                if r.emitted >= r.output_tokens:
                    finished.append(r)
            self.recorder.steps(decoders, self._start, durs)
        self.steps += k
        for r in finished:
            self._finish(r)
        self._k = 0
        self._schedule()

    def _finish(self, req: SimRequest) -> None:
        now = self.loop.now
        self.running.remove(req)
        self.active_tokens -= req.orig_prompt_tokens + req.emitted
        req.finish_s = now
        self._seal_output(req)
        req.sess.chain = req.chain
        self._release(req)
        self.on_finish(req)

    def _seal_output(self, req: SimRequest) -> None:
        """Full chunks of generated tokens (all but the last sampled token) become content-addressed
        cached chunks, as vLLM hashes a block once it is full: a finished or preempted request leaves
        them cached behind its prompt's."""
        full = req.computed // self.C
        out_ids = req.sess.fresh_ids(full - len(req.chain)) if full > len(req.chain) else []
        take = min(len(out_ids), req.private)
        if not take:
            return
        self.hbm.private -= take
        req.private -= take
        self.hbm.insert(out_ids[:take])
        req.chain = req.chain + out_ids[:take]
        req.held += take
        if self.cpu_shadow and self.dram is not None:
            self.dram.put(out_ids[:take])
