"""Coda's admission layer inside vLLM: a scheduler class for ``--scheduler-cls``.

    pip install 'coda[scheduler]'      # into vLLM's environment; changes none of its packages
    vllm serve M --scheduler-cls coda.integrations.vllm.scheduler.CodaScheduler \\
                 --worker-cls coda.integrations.vllm.worker.CodaWorker      # for cohorts only

``CodaScheduler`` is vLLM's scheduler with the policies of ``coda.policy`` (the code the simulator
runs), configured by ``CODA_SCHEDULER_CONFIG`` (``coda.integrations.vllm.settings``), one switch per
mechanism. The one name serves with async scheduling on or off: where vLLM's config turns it on, the
class constructs itself as ``CodaAsyncScheduler``, the same code over vLLM's ``AsyncScheduler``.

- **State admission with tiers.** The waiting queue is a ``PolicyQueue``, whose head is the request
  the state policy (by default ``tiered_aging``) chooses among the oldest ``frontier`` waiting
  requests, from the engine's real view (``coda.integrations.vllm.snapshot``): each candidate's GPU
  prefix-cache hit and, with a supported KV connector, what the connector holds beyond it
  (``coda.integrations.vllm.tiers``), so a prefix held in DRAM is costed as a load, not a
  recompute. When the policy admits nothing, the head is the oldest request, whose allocation then
  fails and ends admission for this step, as vLLM's FCFS does. Probing has no side effects: the GPU
  cache through the coordinator's ``find_longest_cache_hit`` (not ``get_computed_blocks``, which
  feeds the prefix-cache metrics), the connector's store read directly; a candidate's hits are
  cached between steps and revalidated at their boundaries.
- **W_max preemption.** With ``tiered_aging``'s ``preempt``, once the oldest waiting request has
  waited W_max and lacks blocks or a seat, running requests that arrived after it are preempted,
  the youngest first, before vLLM's step (``coda.policy.state.preemption_victims``, the simulator's
  rule too), and the policy admits it first.
- **Cohorts.** Each pure-decode step is planned once, from the scheduled batch, by the execution
  policy; the plan rides on the ``SchedulerOutput`` to ``CodaWorker``'s attention backend
  (``coda.integrations.vllm.cohort_backend``). The ``cohort`` policy plans only from gain bounds
  measured on this engine's device; otherwise cohorts are off, and the startup says why once
  (``coda.integrations.vllm.cohort_gate``).
- **Retention.** With a tool-aware eviction policy, a request that ends with tool calls keeps its
  blocks until its session returns or its predicted return passes, yielding them to any
  allocation that needs them (``coda.integrations.vllm.retention``).

Every decision goes to the trace (``trace`` in the settings) with the rule that made it, and each
step records Coda's added time beside the time of vLLM's own ``schedule()``: CPU time of the
scheduler's thread (``time.thread_time``), so that neither the engine's other threads (which hold
the GIL while they serialize outputs) nor other processes on a busy machine count as either.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from coda.cost.model import build_cost_model
from coda.cost.profile import Profile, load_profile
from coda.integrations.vllm.cohort_gate import cohort_switch, engine_device
from coda.integrations.vllm.compat import RANGE, TESTED, check_version
from coda.integrations.vllm.settings import ENFORCED, SchedulerSettings, load_settings
from coda.integrations.vllm.snapshot import Hits, admission_snapshot
from coda.integrations.vllm.tiers import ExternalProbe, NoTiers, probe_for
from coda.policy.contracts import EvictionPolicy, StatePolicy
from coda.policy.state import overdue, preemption_victims, w_max_of
from coda.shell.build import build_policies
from coda.shell.shadow import Shadowed

try:  # only importable inside a vLLM process
    import vllm
    from vllm.logger import init_logger
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus
except ImportError as err:  # pragma: no cover - exercised only without vLLM
    raise ImportError(f"coda.integrations.vllm.scheduler needs vLLM {RANGE} installed: {err}") from None

from coda import __version__
from coda.integrations.vllm.cohort_plan import PLAN_ATTR, STEP
from coda.integrations.vllm.retention import Retention
from coda.integrations.vllm.tool_calls import ToolCallReader

logger = init_logger("vllm.coda.scheduler")
#: the worker class that runs the cohort plans (imported by vLLM in the worker's process, not here)
WORKER = "coda.integrations.vllm.worker.CodaWorker"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class PolicyQueue(RequestQueue):
    """vLLM's waiting queue, ordered at each peek by a state-admission policy."""

    def __init__(self, scheduler: CodaScheduler, policy: StatePolicy, probe: ExternalProbe, explain_rules: bool = False) -> None:
        self._s = scheduler
        self.policy = policy
        self.probe = probe
        self.explain_rules = explain_rules  # the trace names the rule of each decision (the policy explains instead of choosing)
        self._items: list[Any] = []  # arrival order (preempted requests return to the front)
        self._head: Any = None
        self._hits: dict[str, tuple[int, Hits]] = {}  # request_id -> (num_tokens, hits)
        self.decisions: list[dict[str, Any]] = []  # this step's decisions, in order
        self.popped: list[Any] = []  # requests taken off the queue this step and not put back: admitted, new or resumed
        self.promote_one = policy.admission == "promote_one"
        self.w_max_s, self.preempt = w_max_of(policy)
        self._promoted = False  # promote_one: the policy has chosen this step; vLLM's order admits the rest
        self.policy_s = 0.0  # time spent choosing in this step: the overhead Coda adds

    def front(self) -> list[Any]:
        """The candidates the policy sees: the oldest ``frontier`` waiting requests."""
        return self._items[: self.policy.frontier]

    def overdue(self, front: list[Any]) -> int | None:
        """With W_max preemption, the index in ``front`` of the request it serves, if any."""
        return overdue(time.time(), [r.arrival_time for r in front], self.w_max_s) if self.preempt else None  # type: ignore[arg-type]

    # --- the policy --------------------------------------------------------------------------
    def _hit(self, req: Any) -> Hits:
        """The request's hits by tier, cached while their boundaries hold (two GPU block lookups and the probe's)."""
        kvm = self._s.kv_cache_manager
        pool = kvm.block_pool
        bs = self._s.block_size
        hashes = req.block_hashes
        cached = self._hits.get(req.request_id)
        if cached is not None and cached[0] == req.num_tokens:
            h = cached[1]
            n = h.hbm_tokens // bs
            last_ok = n == 0 or pool.get_cached_block(hashes[n - 1], [0]) is not None
            next_ok = n >= len(hashes) or n * bs >= req.num_tokens - 1 or pool.get_cached_block(hashes[n], [0]) is None
            if last_ok and next_ok and self.probe.still_valid(req, h.hbm_tokens, h.dram_tokens):
                return h
        blocks, hbm, _ = kvm.coordinator.find_longest_cache_hit(hashes, req.num_tokens - 1)
        idle = sum(1 for b in blocks[0] if b.ref_cnt == 0) if blocks else 0
        dram, ssd = self.probe.tokens(req, hbm)
        h = Hits(hbm, idle, dram, ssd)
        self._hits[req.request_id] = (req.num_tokens, h)
        return h

    def _choose(self) -> tuple[Any, tuple[list[Any], Any, Any, int | None] | None]:
        """The request at the head now, and what the trace records of the decision (when tracing)."""
        front = self.front()
        free = self._s.kv_cache_manager.block_pool.get_num_free_blocks() + self._s.coda_reclaimable()
        snap = admission_snapshot(time.time(), front, self._hit, self._s.block_size, free)
        why, shadow = None, None
        if not self.explain_rules:
            idx = self.policy.choose(snap)
        elif isinstance(self.policy, Shadowed):  # choose() runs and counts the shadow; explain() says why
            idx = self.policy.choose(snap)
            shadow = self.policy.last_shadow if idx is not None else None
            why = self.policy.explain(snap)
        else:  # one evaluation gives both
            why = self.policy.explain(snap)
            idx = why.index
        if idx is not None:
            chosen = front[idx]
        else:  # its allocation fails and ends admission: the overdue request W_max preemption serves, else the oldest
            chosen = front[self.overdue(front) or 0]
        if self.promote_one:  # one remove-and-prepend per step
            self._items.remove(chosen)
            self._items.insert(0, chosen)
            self._promoted = True
        return chosen, None if why is None else (front, snap, why, shadow)

    def _record(self, chosen: Any, front: list[Any], snap: Any, why: Any, shadow: int | None) -> None:
        costs = dict(zip(why.scores["feasible"].tolist(), why.scores["raw_cost"].tolist())) if "raw_cost" in why.scores else {}
        self.decisions.append({
            "chosen": chosen.request_id, "head": front[0].request_id,
            "shadow": front[shadow].request_id if shadow is not None else None, "rule": why.rule,
            # per candidate: id, HBM / DRAM / SSD hit tokens, fits, the state cost the policy compared (s)
            "candidates": [[r.request_id, int(snap.hbm_tokens[i]), int(snap.dram_tokens[i]), int(snap.ssd_tokens[i]),
                            bool(snap.fits[i]), costs.get(i)] for i, r in enumerate(front)],
        })

    # --- RequestQueue ------------------------------------------------------------------------
    def peek_request(self) -> Any:
        if not self._items:
            raise IndexError("peek from an empty queue")
        if self._head is None and self._promoted:  # vLLM's order admits the rest; with preempt, an overdue request first
            front = self.front()
            self._head = front[self.overdue(front) or 0]
        elif self._head is None:
            t0 = time.thread_time()
            self._head, traced = self._choose()
            self.policy_s += time.thread_time() - t0
            if traced is not None:  # after the clock: writing the trace is not the policy's time
                self._record(self._head, *traced)
        return self._head

    def pop_request(self) -> Any:
        req = self.peek_request()
        self._items.remove(req)
        self._head = None
        self.popped.append(req)
        return req

    def add_request(self, request: Any) -> None:
        self._items.append(request)
        self._head = None

    def prepend_request(self, request: Any) -> None:
        self.prepend_requests((request,))

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for r in requests:  # same order as vLLM's deque.extendleft
            self._items.insert(0, r)
            if r in self.popped:  # skipped this step, not admitted
                self.popped.remove(r)
        self._head = None

    def remove_request(self, request: Any) -> None:
        self._items.remove(request)
        self._hits.pop(request.request_id, None)
        self._head = None

    def remove_requests(self, requests: Iterable[Any]) -> None:
        drop = set(requests)
        self._items = [r for r in self._items if r not in drop]
        for r in drop:
            self._hits.pop(r.request_id, None)
        self._head = None

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._items))

    def new_step(self) -> None:
        """Aging moves with the clock: decide afresh at each step."""
        self._head = None
        self._promoted = False
        self.decisions = []
        self.popped = []
        self.policy_s = 0.0


class CodaScheduler(Scheduler):
    """vLLM's scheduler with Coda's state admission over KV tiers, cohort plans and tool-aware retention.

    One class for ``--scheduler-cls`` whatever vLLM's config asks: where it turns async scheduling
    on (vLLM's default where the executor supports it, as on GPUs), constructing it gives a
    ``CodaAsyncScheduler``, the same code over vLLM's ``AsyncScheduler``, which is what vLLM's own
    class would be there (``SchedulerConfig.get_scheduler_cls``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> CodaScheduler:
        config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        if cls is CodaScheduler and config.scheduler_config.async_scheduling:
            cls = CodaAsyncScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_version(vllm.__version__)
        super().__init__(*args, **kwargs)
        settings = load_settings()
        spec = settings.policy_spec
        profile = load_profile(settings.profile)
        policies = build_policies(spec, build_cost_model(profile), kinds=ENFORCED)
        self.coda_policies = policies
        self._coda_added_s = 0.0  # Coda's time outside schedule() (arrivals, finishes) since the last step
        trace_path = settings.trace
        self._coda_trace = open(trace_path, "a", buffering=1) if trace_path else None  # noqa: SIM115 - lives as long as the engine
        probe = probe_for(self.connector) if settings.tiers else NoTiers("off (tiers: false)")
        queue = PolicyQueue(self, policies.state, probe, explain_rules=self._coda_trace is not None)
        for req in self.waiting:
            queue.add_request(req)
        self.waiting = queue
        self._coda_queue = queue
        self._coda_cohorts, cohort_note = self._cohorts(spec.execution.name, profile)
        self._coda_retention, retention_note = self._retention(settings, policies.eviction)
        self._coda_step = 0
        self._coda_split_steps = 0
        self._coda_w_max: dict[str, Any] = {"for": None, "preempted": [], "admitted": []}  # this step's W_max events
        self.coda_w_max_counts = {"admissions": 0, "preemptions": 0}  # since startup
        base = "AsyncScheduler (async scheduling on)" if isinstance(self, AsyncScheduler) else "Scheduler (async scheduling off)"
        line = (f"Coda {__version__} in vLLM {vllm.__version__} (tested: {TESTED}); runs as vLLM's {base}; state {spec.state.name}"
                f"{_w_max_note(queue)}; "
                f"tiers {probe.name}; execution {spec.execution.name} ({cohort_note}); eviction {spec.eviction.name} ({retention_note})")
        logger.info(line)
        if self._coda_trace is not None:
            self._coda_trace.write(json.dumps({"coda": __version__, "vllm": vllm.__version__, "tested": TESTED,
                                               "scheduler": type(self).__name__, "policies": spec.describe(),
                                               "profile": settings.profile, "tiers": probe.name, "cohorts": cohort_note,
                                               "retention": retention_note}) + "\n")

    def _cohorts(self, execution: str, profile: Profile) -> tuple[bool, str]:
        """Whether steps are planned: only where ``CodaWorker`` runs the plans (a plan nobody runs
        would only mislead the trace), and, for a policy that plans from the profile, only from gain
        bounds measured on this engine's device (``coda.integrations.vllm.cohort_gate``)."""
        if execution == "full":
            return False, "cohorts off"
        worker_cls = self.vllm_config.parallel_config.worker_cls
        try:
            cls = resolve_obj_by_qualname(worker_cls) if isinstance(worker_cls, str) else worker_cls
            ours = isinstance(cls, type) and WORKER in (f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__)
        except (ImportError, AttributeError, ValueError):
            ours = False
        if not ours:
            return False, f"cohorts off: the worker is {worker_cls}; pass --worker-cls {WORKER}"
        from vllm.platforms import current_platform

        return cohort_switch(execution, profile, engine_device(current_platform))

    def _retention(self, settings: SchedulerSettings, eviction: EvictionPolicy) -> tuple[Retention | None, str]:
        """The holds of an eviction policy that reads sessions (``tool_aware``; none with ``lru``), wired
        to the KV cache manager."""
        if not eviction.session_status:
            return None, "retention off"
        if self.vllm_config.model_config.skip_tokenizer_init:
            return None, "retention off: the engine skips its tokenizer, so tool calls cannot be read"
        from vllm.tokenizers import cached_tokenizer_from_config

        r = settings.retention
        self._coda_tools = ToolCallReader(cached_tokenizer_from_config(self.vllm_config.model_config), r.tool_call_pattern, r.tail_tokens)
        retention = Retention(self.kv_cache_manager.block_pool, eviction, r)
        allocate = self.kv_cache_manager.allocate_slots

        def allocate_slots(*args: Any, **kwargs: Any) -> Any:
            """Every allocation of the KV cache manager, with the holds yielding to it."""
            return retention.allocate(lambda: allocate(*args, **kwargs), time.time())

        self.kv_cache_manager.allocate_slots = allocate_slots  # type: ignore[method-assign]
        return retention, f"retention on: holds up to {r.hold_factor:g} x the predicted tool time, {r.prior_s:g} s before it is learned"

    def coda_reclaimable(self) -> int:
        """Held blocks admission may claim (a hold yields to any allocation)."""
        return self._coda_retention.reclaimable() if self._coda_retention is not None else 0

    # --- arrivals and finishes ------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        super().add_request(request)
        if self._coda_retention is not None:
            t0 = time.thread_time()
            self._coda_retention.arrived(request.request_id, request.block_hashes, time.time())
            self._coda_added_s += time.thread_time() - t0

    def _free_blocks(self, request: Any) -> None:
        retention = self._coda_retention
        if retention is not None:
            t0 = time.thread_time()
            retention.left(request.request_id)
            if request.status == RequestStatus.FINISHED_STOPPED:
                tools = self._coda_tools.tools(request.output_token_ids)
                full = request.num_prompt_tokens // self.hash_block_size
                key = request.block_hashes[full - 1] if 0 < full <= len(request.block_hashes) else None
                blocks = [b for group in self.kv_cache_manager.get_blocks(request.request_id).blocks for b in group]
                retention.finished(request.request_id, key, blocks, tools, time.time())
            self._coda_added_s += time.thread_time() - t0
        super()._free_blocks(request)

    # --- the step --------------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> Any:
        t0 = time.thread_time()
        queue, retention = self._coda_queue, self._coda_retention
        queue.new_step()
        if retention is not None:
            retention.expire(time.time())
        w_max = self._coda_w_max = {"for": None, "preempted": [], "admitted": []}
        if queue.preempt and queue:
            self._preempt_for_overdue()
        t1 = time.thread_time()
        out = super().schedule(throttle_prefills)
        t2 = time.thread_time()
        if queue.w_max_s is not None:
            now = time.time()
            w_max["admitted"] = [r.request_id for r in queue.popped if now - r.arrival_time >= queue.w_max_s]
            self.coda_w_max_counts["admissions"] += len(w_max["admitted"])
        if retention is not None:
            retention.admitted(r.req_id for r in out.scheduled_new_reqs)
        t3 = time.thread_time()
        cohort = self._plan(out) if self._coda_cohorts else None
        t4 = time.thread_time()
        yielded = retention.yield_s if retention is not None else 0.0
        # Coda's CPU time in this step, by mechanism (state admission's includes its probes of the tiers)
        parts = {"admission": queue.policy_s, "plan": t4 - t3, "retention": self._coda_added_s + (t1 - t0) + yielded + (t3 - t2)}
        if self._coda_trace is not None and (out.num_scheduled_tokens or queue.decisions or w_max["preempted"]
                                             or (retention is not None and retention.events)):
            self._trace(out, cohort, parts, (t2 - t1) - queue.policy_s - yielded)
        if retention is not None:
            retention.events = []
            retention.yield_s = 0.0
        self._coda_added_s = 0.0
        return out

    def _preempt_for_overdue(self) -> None:
        """W_max preemption, before vLLM's step: once the oldest waiting request has waited W_max and
        lacks blocks or a seat, preempt running requests in the policy core's order until it has both
        (the simulator's worker runs the same rule). Here no request of this step is scheduled yet, so
        nothing needs unwinding; vLLM's own preemption then admits the overdue request as usual."""
        queue, kvm = self._coda_queue, self.kv_cache_manager
        pool, bs = kvm.block_pool, self.block_size
        front = queue.front()
        late = queue.overdue(front)
        if late is None:
            return
        req = front[late]

        def lack() -> int:
            """Blocks it lacks: its prompt's beyond its GPU hit, and its idle hits, against what admission may claim."""
            free = pool.get_num_free_blocks() + self.coda_reclaimable()
            return int(admission_snapshot(time.time(), [req], queue._hit, bs, free).extra_blocks[0]) + queue._hit(req).idle_blocks - free

        def seat_needed() -> bool:
            return len(self.running) >= self.max_num_running_reqs

        if lack() <= 0 and not seat_needed():
            return
        hit, _, _ = kvm.coordinator.find_longest_cache_hit(req.block_hashes, req.num_tokens - 1)
        mine = {b.block_id for group in hit for b in group}
        # blocks each preemption frees: those only it holds, other than the overdue request's own hits
        candidates = [r for r in self.running if self._request_blocks_can_be_freed(r)]
        rows = [(r.arrival_time, sum(1 for group in kvm.get_blocks(r.request_id).blocks for b in group
                                     if b.ref_cnt == 1 and b.block_id not in mine)) for r in candidates]
        self._coda_w_max["for"] = req.request_id
        for i in preemption_victims(req.arrival_time, lack(), seat_needed(), rows):
            if lack() <= 0 and not seat_needed():
                break
            victim = candidates[i]
            self.running.remove(victim)
            self._preempt_request(victim, time.monotonic(), drop_stale_output=self.requires_kv_delivery)
            self._coda_w_max["preempted"].append(victim.request_id)
            self.coda_w_max_counts["preemptions"] += 1

    def _plan(self, out: Any) -> dict[str, Any] | None:
        """The step's cohort plan: only pure-decode steps (every scheduled request one token, none new)."""
        sched = out.num_scheduled_tokens
        if not sched or out.scheduled_new_reqs or out.scheduled_spec_decode_tokens or any(n != 1 for n in sched.values()):
            return None
        contexts = [self.requests[rid].num_computed_tokens for rid in sched]
        record = {"n": len(contexts), "contexts": [min(contexts), max(contexts)]}
        if len(contexts) < 2:  # no policy is asked: a split needs two cohorts
            return record | {"cut": None, "rule": "one request: nothing to split", "predicted_gain": None, "gain_lower_bound": None}
        choice = self.coda_policies.execution.explain(np.array(contexts, dtype=np.int64))
        plan = choice.plan
        if plan is not None:
            setattr(out, PLAN_ATTR, (len(contexts), plan.cut))
        return record | {"cut": None if plan is None else plan.cut, "rule": choice.rule,
                         "predicted_gain": None if plan is None else _finite(plan.predicted_gain),
                         "gain_lower_bound": None if plan is None else _finite(plan.gain_lower_bound)}

    def _trace(self, out: Any, cohort: dict[str, Any] | None, parts: dict[str, float], vllm_s: float) -> None:
        self._coda_step += 1
        split_now, self._coda_split_steps = STEP.split_steps - self._coda_split_steps, STEP.split_steps
        record = {
            "step": self._coda_step,
            "t": time.time(),
            "scheduled_new": [[r.req_id, r.num_computed_tokens] for r in out.scheduled_new_reqs],
            "decisions": self._coda_queue.decisions,
            "cohort": cohort,
            # steps the worker ran split since the previous record (seen only with the worker in this process)
            "split_steps": split_now,
            # W_max: the overdue request preempted for, the requests preempted, admissions of requests that had waited W_max
            "w_max": self._coda_w_max if self._coda_queue.w_max_s is not None else None,
            "retention": self._coda_retention.events if self._coda_retention is not None else [],
            "held_requests": self._coda_retention.held_requests() if self._coda_retention is not None else 0,
            "coda_ms": sum(parts.values()) * 1e3,  # Coda's work for this step: choices, probes, plans, holds (trace writing excluded)
            "coda_parts_ms": {k: v * 1e3 for k, v in parts.items()},
            "vllm_ms": vllm_s * 1e3,  # vLLM's own schedule() time in this step, without Coda's choices
            "waiting": len(self._coda_queue),
            "running": len(self.running),
        }
        self._coda_trace.write(json.dumps(record) + "\n")  # type: ignore[union-attr]


class CodaAsyncScheduler(CodaScheduler, AsyncScheduler):
    """``CodaScheduler`` over vLLM's ``AsyncScheduler`` (through the MRO, as vLLM-Ascend's recompute
    scheduler does): what ``CodaScheduler`` constructs where vLLM's config turns async scheduling on."""


def _w_max_note(queue: PolicyQueue) -> str:
    if queue.w_max_s is None:
        return ""
    return f" (W_max {queue.w_max_s:g} s{', bounded by preemption' if queue.preempt else ''})"
