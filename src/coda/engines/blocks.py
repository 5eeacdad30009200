"""Naming KV chunks by content: chained hashes of token blocks, interned as the simulator's chunk ids.

The simulator names chunks by session (``SessionState.fresh_ids``); an engine only sees tokens,
so here a request's chunks are the hashes of its token blocks and two requests share a chunk
exactly when they share the token prefix up to its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from coda.protocol import tokenizer as tok
from coda.sim.kvcache import OWNER_SHIFT
from coda.sim.request import SessionState


class BlockRegistry:
    """Interns content hashes of token blocks as the worker's chunk ids (``owner << 32 | n``) and
    keeps what a KV event says about each (hash, parent hash, token ids when events are on).

    Entries are never dropped: memory grows with distinct blocks seen (about 100 bytes each, plus
    the token ids when KV events are on)."""

    def __init__(self, owner: int, block_tokens: int, keep_tokens: bool) -> None:
        self.base = owner << OWNER_SHIFT
        self.C = block_tokens
        self._ids: dict[int, int] = {}
        self.hashes: list[int] = []
        self.parents: list[int | None] = []
        self.tokens: list[list[int]] | None = [] if keep_tokens else None

    def intern(self, hashes: Sequence[int], words: Sequence[str], start: int, n: int) -> list[int]:
        out = []
        ids, C = self._ids, self.C
        for i in range(start, start + n):
            h = hashes[i]
            cid = ids.get(h)
            if cid is None:
                cid = ids[h] = self.base | len(self.hashes)
                self.hashes.append(h)
                self.parents.append(hashes[i - 1] if i else None)
                if self.tokens is not None:
                    self.tokens.append(tok.token_ids(words[i * C : (i + 1) * C]))
            out.append(cid)
        return out

    def local(self, cid: int) -> int:
        return cid & ((1 << OWNER_SHIFT) - 1)


_ANONYMOUS = SimpleNamespace(session_id="", start_s=0.0)


class TokenSequence(SessionState):
    """Stands in for a session: the worker asks it to name a request's next chunks (its output
    after a finish, prompt + output after a preemption), and it answers with content hashes."""

    __slots__ = ("req", "hashes", "words", "registry")

    def __init__(self, owner: int, registry: BlockRegistry, words: list[str]) -> None:
        super().__init__(0, _ANONYMOUS, owner)
        self.registry = registry
        self.words = words
        self.hashes = tok.block_hashes(words, registry.C)
        self.req: Any = None  # the request whose chunks these are (set once it exists)

    def fresh_ids(self, n: int) -> list[int]:
        assert self.req is not None
        start = len(self.req.chain)
        n = min(n, len(self.hashes) - start)
        return self.registry.intern(self.hashes, self.words, start, n)
