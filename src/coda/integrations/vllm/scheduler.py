"""Tiered-Aging inside vLLM: a scheduler class for ``--scheduler-cls``.

    pip install 'coda[scheduler]'      # into vLLM's environment; changes none of its packages
    vllm serve M --scheduler-cls coda.integrations.vllm.scheduler.CodaScheduler

vLLM's scheduler admits waiting requests by peeking at the head of its waiting queue until an
allocation fails. ``CodaScheduler`` replaces that queue with ``TieredAgingQueue``, whose head is
the request the ``tiered_aging`` policy of ``coda.policy`` (the same code the simulator runs)
chooses among the oldest ``frontier`` waiting requests: state cost from the engine's real view
(GPU prefix-cache hit of each candidate, missing and new tokens through the cost profile),
ready time from the request's arrival, W_max and the starvation guard. When the policy admits
nothing (nothing fits, or the guard holds the queue for the oldest request), the head is the
oldest request, whose allocation then fails and ends admission for this step, as vLLM's FCFS does.

Probing has no side effects: candidates are matched with the cache coordinator's
``find_longest_cache_hit`` (not ``get_computed_blocks``, which feeds the prefix-cache metrics),
and a candidate's hit is cached between steps and revalidated with two block lookups.

Configuration: ``CODA_SCHEDULER_CONFIG`` (a JSON object, or a path to a JSON/YAML file) with
``tau_s``, ``w_max_s``, ``frontier``, ``starvation_guard``, ``profile`` and ``trace`` (a JSONL
path where every step's admitted requests, their cached tokens and what FCFS would have chosen
are written — the shadow log).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.integrations.vllm.compat import RANGE, check_version
from coda.policy.state import TieredAging
from coda.types import AdmissionSnapshot

CONFIG_ENV = "CODA_SCHEDULER_CONFIG"

try:  # only importable inside a vLLM process
    import vllm
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler
except ImportError as err:  # pragma: no cover - exercised only without vLLM
    raise ImportError(f"coda.integrations.vllm.scheduler needs vLLM {RANGE} installed: {err}") from None


def load_settings() -> dict[str, Any]:
    """Settings from ``CODA_SCHEDULER_CONFIG`` (inline JSON or a file path); empty when unset."""
    raw = os.environ.get(CONFIG_ENV, "").strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        data = json.loads(raw)
    else:
        path = Path(raw)
        if not path.exists():
            raise RuntimeError(f"{CONFIG_ENV}={raw}: no such file; pass inline JSON or a path to a JSON/YAML file")
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(path.read_text()) or {}
        else:
            data = json.loads(path.read_text())
    known = {"tau_s", "w_max_s", "frontier", "starvation_guard", "profile", "trace"}
    unknown = set(data) - known
    if unknown:
        raise RuntimeError(f"{CONFIG_ENV}: unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(known))}")
    return data


class TieredAgingQueue(RequestQueue):
    """vLLM's waiting queue, ordered at each peek by the Tiered-Aging policy."""

    def __init__(self, scheduler: Scheduler, policy: TieredAging) -> None:
        self._s = scheduler
        self.policy = policy
        self._items: list[Any] = []  # arrival order (preempted requests return to the front)
        self._head: Any = None
        self._hits: dict[str, tuple[int, int, int]] = {}  # request_id -> (num_tokens, hit_tokens, idle_hit_blocks)
        self.decisions: list[tuple[str, str]] = []  # (chosen, fcfs head) of this step
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
        items = self._items
        front = items[: self.policy.frontier]
        bs = self._s.block_size
        free = self._s.kv_cache_manager.block_pool.get_num_free_blocks()
        rows = []
        for i, req in enumerate(front):
            hit, idle = self._hit(req, bs)
            extra = -(-(req.num_tokens + 1) // bs) - hit // bs
            rows.append((i, req.arrival_time, req.num_tokens, hit, 0, 0, extra, extra + idle <= free))
        idx = self.policy.choose(AdmissionSnapshot.from_rows(time.time(), rows, free_blocks=free))
        chosen = front[0] if idx is None else front[idx]
        self.decisions.append((chosen.request_id, front[0].request_id))
        return chosen

    # --- RequestQueue ------------------------------------------------------------------------
    def peek_request(self) -> Any:
        if not self._items:
            raise IndexError("peek from an empty queue")
        if self._head is None:
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
        self.decisions = []
        self.policy_s = 0.0


class CodaScheduler(Scheduler):
    """vLLM's scheduler with Coda's Tiered-Aging order of KV-state preparation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_version(vllm.__version__)
        super().__init__(*args, **kwargs)
        settings = load_settings()
        profile = load_profile(settings.get("profile", "a100-qwen3coder30b-fp8"))
        policy = TieredAging(
            build_cost_model(profile),
            tau_s=float(settings.get("tau_s", 5.0)),
            w_max_s=float(settings.get("w_max_s", 20.0)),
            frontier=int(settings.get("frontier", 64)),
            starvation_guard=bool(settings.get("starvation_guard", True)),
        )
        trace_path = settings.get("trace")
        self._coda_trace = open(trace_path, "a", buffering=1) if trace_path else None  # noqa: SIM115 - lives as long as the engine
        queue = TieredAgingQueue(self, policy)
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
