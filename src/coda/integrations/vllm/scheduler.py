"""Coda's state admission inside vLLM: a scheduler class for ``--scheduler-cls``.

    pip install 'coda[scheduler]'      # into vLLM's environment; changes none of its packages
    vllm serve M --scheduler-cls coda.integrations.vllm.scheduler.CodaScheduler

vLLM's scheduler admits waiting requests by peeking at the head of its waiting queue until an
allocation fails. ``CodaScheduler`` replaces that queue with ``PolicyQueue``, whose head is the
request the state-admission policy of ``coda.policy`` (the same code the simulator runs: by
default ``tiered_aging``; any registered one through ``CODA_SCHEDULER_CONFIG``, see
``coda.integrations.vllm.settings``) chooses among the oldest ``frontier`` waiting requests, from
the engine's real view (``coda.integrations.vllm.snapshot``). When the policy admits nothing
(nothing fits, or a guard holds the queue for the oldest request), the head is the oldest request,
whose allocation then fails and ends admission for this step, as vLLM's FCFS does.

Probing has no side effects: candidates are matched with the cache coordinator's
``find_longest_cache_hit`` (not ``get_computed_blocks``, which feeds the prefix-cache metrics),
and a candidate's hit is cached between steps and revalidated with two block lookups.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.integrations.vllm.compat import RANGE, check_version
from coda.integrations.vllm.settings import load_settings
from coda.integrations.vllm.snapshot import admission_snapshot
from coda.policy.contracts import StatePolicy
from coda.shell.build import build_policies
from coda.shell.shadow import Shadowed

try:  # only importable inside a vLLM process
    import vllm
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler
except ImportError as err:  # pragma: no cover - exercised only without vLLM
    raise ImportError(f"coda.integrations.vllm.scheduler needs vLLM {RANGE} installed: {err}") from None


class PolicyQueue(RequestQueue):
    """vLLM's waiting queue, ordered at each peek by a state-admission policy."""

    def __init__(self, scheduler: Scheduler, policy: StatePolicy, explain_rules: bool = False) -> None:
        self._s = scheduler
        self.policy = policy
        self.explain_rules = explain_rules  # the trace names the rule of each decision (one more evaluation per decision)
        self._items: list[Any] = []  # arrival order (preempted requests return to the front)
        self._head: Any = None
        self._hits: dict[str, tuple[int, int, int]] = {}  # request_id -> (num_tokens, hit_tokens, idle_hit_blocks)
        self.decisions: list[list[str | None]] = []  # this step's [chosen, FCFS head, the shadow's choice, the rule that decided]
        self.promote_one = policy.admission == "promote_one"
        self._promoted = False  # promote_one: the policy has chosen this step; vLLM's order admits the rest
        self.policy_s = 0.0  # time spent choosing in this step: the overhead Coda adds

    # --- the policy --------------------------------------------------------------------------
    def _hit(self, req: Any, block_size: int) -> tuple[int, int]:
        """(GPU prefix-cache hit tokens, idle hit blocks), cached while two boundary blocks agree."""
        kvm = self._s.kv_cache_manager
        pool = kvm.block_pool
        hashes = req.block_hashes
        cached = self._hits.get(req.request_id)
        if cached is not None and cached[0] == req.num_tokens:
            n = cached[1] // block_size
            last_ok = n == 0 or pool.get_cached_block(hashes[n - 1], [0]) is not None
            next_ok = n >= len(hashes) or n * block_size >= req.num_tokens - 1 or pool.get_cached_block(hashes[n], [0]) is None
            if last_ok and next_ok:
                return cached[1], cached[2]
        blocks, hit, _ = kvm.coordinator.find_longest_cache_hit(hashes, req.num_tokens - 1)
        idle = sum(1 for b in blocks[0] if b.ref_cnt == 0) if blocks else 0
        self._hits[req.request_id] = (req.num_tokens, hit, idle)
        return hit, idle

    def _choose(self) -> Any:
        front = self._items[: self.policy.frontier]
        bs = self._s.block_size
        free = self._s.kv_cache_manager.block_pool.get_num_free_blocks()
        snap = admission_snapshot(time.time(), front, lambda r: self._hit(r, bs), bs, free)
        idx = self.policy.choose(snap)
        chosen = front[0] if idx is None else front[idx]
        shadow = self.policy.last_shadow if isinstance(self.policy, Shadowed) and idx is not None else None
        rule = self.policy.explain(snap).rule if self.explain_rules else None
        self.decisions.append([chosen.request_id, front[0].request_id, front[shadow].request_id if shadow is not None else None, rule])
        if self.promote_one:  # one remove-and-prepend per step
            self._items.remove(chosen)
            self._items.insert(0, chosen)
            self._promoted = True
        return chosen

    # --- RequestQueue ------------------------------------------------------------------------
    def peek_request(self) -> Any:
        if not self._items:
            raise IndexError("peek from an empty queue")
        if self._head is None and self._promoted:
            self._head = self._items[0]
        elif self._head is None:
            t0 = time.perf_counter()
            self._head = self._choose()
            self.policy_s += time.perf_counter() - t0
        return self._head

    def pop_request(self) -> Any:
        req = self.peek_request()
        self._items.remove(req)
        self._head = None
        return req

    def add_request(self, request: Any) -> None:
        self._items.append(request)
        self._head = None

    def prepend_request(self, request: Any) -> None:
        self._items.insert(0, request)
        self._head = None

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for r in requests:  # same order as vLLM's deque.extendleft
            self._items.insert(0, r)
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
        self.policy_s = 0.0


class CodaScheduler(Scheduler):
    """vLLM's scheduler with a Coda state-admission order of KV-state preparation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_version(vllm.__version__)
        super().__init__(*args, **kwargs)
        settings = load_settings()
        spec = settings.policy_spec
        self.coda_policies = build_policies(spec, build_cost_model(load_profile(settings.profile)), kinds=("state",))
        trace_path = settings.trace
        self._coda_trace = open(trace_path, "a", buffering=1) if trace_path else None  # noqa: SIM115 - lives as long as the engine
        if self._coda_trace is not None:
            self._coda_trace.write(json.dumps({"policies": spec.describe(), "profile": settings.profile}) + "\n")
        queue = PolicyQueue(self, self.coda_policies.state, explain_rules=self._coda_trace is not None)
        for req in self.waiting:
            queue.add_request(req)
        self.waiting = queue
        self._coda_queue = queue
        self._coda_step = 0

    def schedule(self, throttle_prefills: bool = False) -> Any:
        self._coda_queue.new_step()
        t0 = time.perf_counter()
        out = super().schedule(throttle_prefills)
        if self._coda_trace is not None and (out.scheduled_new_reqs or self._coda_queue.decisions or len(self._coda_queue)):
            self._coda_step += 1
            self._coda_trace.write(json.dumps({
                "step": self._coda_step,
                "t": time.time(),
                "scheduled_new": [[r.req_id, r.num_computed_tokens] for r in out.scheduled_new_reqs],
                "decisions": self._coda_queue.decisions,
                "schedule_ms": (time.perf_counter() - t0) * 1e3,
                "coda_ms": self._coda_queue.policy_s * 1e3,
                "waiting": len(self._coda_queue),
                "running": len(self.running),
            }) + "\n")
        return out
