"""The KV chunk ids of each prompt: a session's rounds extend its own chain, sessions of a prefix
group share the group's leading chunks, and a trace's block hashes map to ids interned once, so
equal prefixes get equal ids (``coda.sim.kvcache``: an id's high bits name its owner)."""

from __future__ import annotations

from coda.sim.kvcache import OWNER_SHIFT, Versions
from coda.sim.request import SessionState
from coda.workload.schema import Workload


class ChunkChains:
    def __init__(self, workload: Workload, chunk_tokens: int, versions: Versions) -> None:
        self.workload = workload
        self.C = chunk_tokens
        self.versions = versions
        self._group_owner: dict[str, int] = {}
        self._trace_owner = versions.new_owner()
        self._interned: dict[tuple[int, int], int] = {}

    def chain(self, sess: SessionState, k: int, prefix: int, prompt: int) -> tuple[list[int], tuple[int, ...]]:
        """Chunk ids of round ``k``'s full chunks (reused prefix ids, then fresh content) and the
        owners they belong to."""
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
