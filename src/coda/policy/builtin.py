"""Coda's own policies, registered under their names (the registry imports this on first use)."""

from __future__ import annotations

from coda.policy import ingress
from coda.policy.eviction import Lru, ToolAware
from coda.policy.execution import Cohort, FullBatch, SplitAlways
from coda.policy.registry import register
from coda.policy.routing import CodaRouter, DynamoKV, LeastLoaded, RoundRobin, SMetric
from coda.policy.state import FewestBlocks, Fifo, TieredAging

for _name, _cls in {
    "admit_all": ingress.AdmitAll, "queue_limit": ingress.QueueLimit, "kv_headroom": ingress.KVHeadroom,
    "tenant_share": ingress.TenantShare, "overload": ingress.Overload, "session": ingress.SessionAdmission,
    "deadline": ingress.Deadline,
}.items():
    register("ingress", _name, _cls)
for _name, _cls in {"round_robin": RoundRobin, "least_loaded": LeastLoaded, "smetric": SMetric, "dynamo_kv": DynamoKV, "coda": CodaRouter}.items():
    register("router", _name, _cls)
for _name, _cls in {"fifo": Fifo, "fewest_blocks": FewestBlocks, "tiered_aging": TieredAging}.items():
    register("state", _name, _cls)
register("execution", "full", FullBatch)
register("execution", "cohort", Cohort)
register("execution", "split_always", SplitAlways)
register("eviction", "lru", Lru)
register("eviction", "tool_aware", ToolAware)
