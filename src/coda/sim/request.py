"""Simulator-side request and session state (mutable, slotted; never handed to policies)."""

from __future__ import annotations

from typing import Any

WAITING, RESTORING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3, 4
STATE_NAMES = ("waiting", "restoring", "running", "finished", "rejected")


class SessionState:
    """A session's progress: its content chain (chunk ids of the context so far) and next round."""

    __slots__ = ("index", "session", "owner", "next_id", "chain", "next_round", "context_tokens", "done", "started_s",
                 "out_since", "out_tools")

    def __init__(self, index: int, session: Any, owner: int) -> None:
        self.index = index
        self.session = session
        self.owner = owner
        self.next_id = 0
        self.chain: list[int] = []
        self.next_round = 0
        self.context_tokens = 0
        self.done = False
        self.started_s = session.start_s
        # observable: when the session's last response ended and which tools it called (() = user turn)
        self.out_since: float | None = None
        self.out_tools: tuple[str, ...] = ()

    def fresh_ids(self, n: int) -> list[int]:
        base = (self.owner << 32) | self.next_id
        self.next_id += n
        return list(range(base, base + n))


class SimRequest:
    """One round of a session inside the simulator.

    ``output_tokens`` is the trace's hidden future: the worker uses it to know when the request
    ends, but no snapshot handed to a policy ever contains it.
    """

    __slots__ = (
        "rid", "sess", "round_idx", "kind", "ready_s", "arrived_s", "measured",
        "prompt_tokens", "orig_prompt_tokens", "new_input_tokens", "reused_tokens", "output_tokens",
        "chain", "owners", "worker", "state",
        "computed", "emitted", "held", "private", "admit_seq",
        "admitted_s", "state_ready_s", "first_token_s", "finish_s", "last_token_s",
        "hbm_hit", "dram_hit", "ssd_hit", "path", "preemptions", "tbt_max", "cohort_steps",
        "match_key", "match", "tools", "deferred_since", "reason", "ingress_tokens",
    )

    def __init__(self, rid: int, sess: SessionState, round_idx: int, kind: str, ready_s: float) -> None:
        self.rid = rid
        self.sess = sess
        self.round_idx = round_idx
        self.kind = kind
        self.ready_s = ready_s
        self.arrived_s = -1.0  # when it first entered a worker's waiting queue (after any ingress deferral)
        self.measured = False
        self.prompt_tokens = 0
        self.orig_prompt_tokens = 0
        self.new_input_tokens = 0
        self.reused_tokens = 0
        self.output_tokens = 0
        self.chain: list[int] = []
        self.owners: tuple[int, ...] = ()
        self.worker = -1
        self.state = WAITING
        self.computed = 0
        self.emitted = 0
        self.held = 0
        self.private = 0
        self.admit_seq = 0
        self.admitted_s = -1.0
        self.state_ready_s = -1.0
        self.first_token_s = -1.0
        self.finish_s = -1.0
        self.last_token_s = -1.0
        self.hbm_hit = self.dram_hit = self.ssd_hit = -1
        self.path = ""
        self.preemptions = 0
        self.tbt_max = 0.0
        self.cohort_steps = 0
        self.match_key: Any = None
        self.match: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.tools: tuple[str, ...] = ()
        self.deferred_since = -1.0  # first time ingress admission deferred it
        self.reason = ""  # why it was rejected
        self.ingress_tokens = 0  # what ingress counted it to newly occupy on its worker (``WorkerLoad.new_tokens``)

    def record(self) -> dict[str, Any]:
        """The per-request record written with ``--out``."""
        ttft = self.first_token_s - self.ready_s if self.first_token_s >= 0 else None
        done = self.finish_s >= 0
        tbt = (self.finish_s - self.first_token_s) / (self.output_tokens - 1) if done and self.output_tokens > 1 else None
        return {
            "request_id": self.rid,
            "session_id": self.sess.session.session_id,
            "round": self.round_idx,
            "session_rounds": len(self.sess.session.rounds),
            "kind": self.kind,
            "worker": self.worker,
            "measured": self.measured,
            "ready_s": self.ready_s,
            "arrived_s": self.arrived_s if self.arrived_s >= 0 else None,
            "admitted_s": self.admitted_s if self.admitted_s >= 0 else None,
            "state_ready_s": self.state_ready_s if self.state_ready_s >= 0 else None,
            "first_token_s": self.first_token_s if self.first_token_s >= 0 else None,
            "finish_s": self.finish_s if done else None,
            "ttft_s": ttft,
            "e2e_s": self.finish_s - self.ready_s if done else None,
            "tbt_mean_s": tbt,
            "tbt_max_s": self.tbt_max if done else None,
            "prompt_tokens": self.orig_prompt_tokens,
            "new_input_tokens": self.new_input_tokens,
            "reusable_tokens": self.reused_tokens,
            "output_tokens": self.output_tokens,
            "hbm_hit_tokens": max(self.hbm_hit, 0),
            "dram_hit_tokens": max(self.dram_hit, 0),
            "ssd_hit_tokens": max(self.ssd_hit, 0),
            "path": self.path,
            "preemptions": self.preemptions,
            "cohort_steps": self.cohort_steps,
            "state": "completed" if done else ("rejected" if self.state == REJECTED else "unfinished"),
            "reason": self.reason or None,
            "deferred": self.deferred_since >= 0,
        }
