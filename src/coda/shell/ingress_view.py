"""The ``IngressSnapshot`` every shell puts in front of its ingress policy, built in one place so
that its fields mean the same in the simulator and the gateway: the session's slot and deferral
from the shell's ``SessionLedger`` (or, in the gateway, the slots its shared store found), and the
tenant's weight against the weights of the tenants with work in flight (its own included)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from coda.policy.snapshots import IngressSnapshot, WorkerLoad
from coda.policy.spec import TenantSpec
from coda.shell.sessions import SessionCap, SessionLedger


def ingress_snapshot(
    *,
    now: float,
    tenant: str,
    prompt_tokens: int,
    workers: tuple[WorkerLoad, ...],
    session_id: str,
    ledger: SessionLedger,
    prefix_hit: float,
    tenant_tokens: Mapping[str, int],
    tenant_spec: Callable[[str], TenantSpec],
    deadline_slack_s: float,
    queued: int,
    held_continuations: int,
    slots: tuple[bool, int] | None = None,
    cap: SessionCap | None = None,
) -> IngressSnapshot:
    """``slots``: (whether the session holds a slot, how many are held), where the shell reads
    them elsewhere than ``ledger``; the ledger still keeps how long the session has been deferred.
    ``cap``: the shell's adaptive session cap, where the policy gives a rule for one."""
    active, count = slots if slots is not None else (ledger.active(session_id, now), ledger.count(now))
    busy = {name for name, n in tenant_tokens.items() if n > 0} | {tenant}
    return IngressSnapshot(
        now_s=now,
        tenant=tenant,
        prompt_tokens=prompt_tokens,
        workers=workers,
        session_id=session_id,
        session_active=active,
        active_sessions=count,
        session_deferred_s=ledger.deferred_for_s(session_id, now),
        prefix_hit=prefix_hit,
        tenant_inflight_tokens=tenant_tokens.get(tenant, 0),
        tenant_weight=tenant_spec(tenant).weight,
        active_weight=sum(tenant_spec(name).weight for name in busy),
        deadline_slack_s=deadline_slack_s,
        queued=queued,
        held_continuations=held_continuations,
        session_cap=cap.limit if cap is not None else 0,
    )
