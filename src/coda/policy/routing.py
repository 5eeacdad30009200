"""Routing: which worker serves a request."""

from __future__ import annotations

from typing import Protocol

from coda.types import RoutingSnapshot


class Router(Protocol):
    name: str

    def route(self, snap: RoutingSnapshot) -> int:
        """The chosen ``worker_id`` (one of ``snap.workers``)."""
        ...


def healthy_workers(snap: RoutingSnapshot) -> list[int]:
    ids = [w.worker_id for w in snap.workers if w.healthy]
    return ids or [w.worker_id for w in snap.workers]


class RoundRobin:
    """The request's arrival counter modulo the healthy workers."""

    name = "round_robin"

    def route(self, snap: RoutingSnapshot) -> int:
        ids = healthy_workers(snap)
        return ids[snap.request.seq % len(ids)]
