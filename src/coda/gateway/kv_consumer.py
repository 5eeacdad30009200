"""Consume an engine's KV-cache events (vLLM's ZMQ publisher, or ``coda fake-engine --kv-events``)
into the gateway's ``KVIndexer``.

An engine names blocks with its own hashes (vLLM: sha256 of the parent hash and the block's
tokens, salted). The gateway cannot compute those for a new prompt, so each stored block is
re-named with the gateway's own chained hash of its token ids (``BlockHasher``, seeded with the
parent's local name), the same hash it computes for prompts with an exact tokenizer; removals
are translated back through the map. A block whose parent the gateway never saw is skipped.

Batches carry sequence numbers. A gap (messages dropped past the publisher's high-water mark,
or a reconnect) asks the replay socket for the missing batches; without one, or when the
engine restarted (sequence numbers went back), the worker's blocks are forgotten rather than
trusted. Re-admission after a health failure replays from the last batch seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from coda.gateway.view import Worker
from coda.protocol.kv_events import (
    MEDIUM_CPU,
    MEDIUM_DISK,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventError,
    decode_frames,
)
from coda.shell.kvindex import BlockHasher, KVIndexer

log = logging.getLogger("coda.gateway")
REPLAY_TIMEOUT_S = 2.0
RESTART_GAP = 10_000  # a sequence number this far back means the publisher restarted


@dataclass
class ConsumerStats:
    batches: int = 0
    gaps: int = 0
    replays: int = 0
    skipped_blocks: int = 0
    bad_messages: int = 0


class BlockTranslator:
    """Engine block hashes -> the gateway's local hashes, per worker, reference-counted by tier."""

    def __init__(self, w: Worker, indexer: KVIndexer, block_tokens: int) -> None:
        self.w = w
        self.indexer = indexer
        self.block_tokens = block_tokens
        self._local: dict[int | bytes, int] = {}
        self._refs: dict[int | bytes, int] = {}
        self.skipped = 0

    def location(self, medium: str | None) -> str:
        t = self.w.tiers
        loc = t.dram if medium == MEDIUM_CPU else t.ssd if medium == MEDIUM_DISK else t.hbm
        return loc or t.hbm

    def apply(self, batch: KVEventBatch) -> None:
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(ev)
            elif isinstance(ev, BlockRemoved):
                loc = self.location(ev.medium)
                gone = []
                for h in ev.block_hashes:
                    local = self._local.get(h)
                    if local is None:
                        continue
                    gone.append(local)
                    refs = self._refs[h] - 1
                    if refs <= 0:
                        del self._local[h], self._refs[h]
                    else:
                        self._refs[h] = refs
                self.indexer.removed(loc, gone)
            elif isinstance(ev, AllBlocksCleared):
                self.clear()

    def _stored(self, ev: BlockStored) -> None:
        if ev.block_size != self.block_tokens or ev.lora_id is not None:
            self.skipped += len(ev.block_hashes)  # another block size or a LoRA: not comparable with prompts
            return
        if ev.parent_block_hash is None:
            seed = 0
        elif ev.parent_block_hash in self._local:
            seed = self._local[ev.parent_block_hash]
        else:
            self.skipped += len(ev.block_hashes)
            return
        local = BlockHasher(self.block_tokens, seed=seed).update(ev.token_ids)
        for h, lh in zip(ev.block_hashes, local):
            self._local[h] = lh
            self._refs[h] = self._refs.get(h, 0) + 1
        self.indexer.stored(self.location(ev.medium), local)

    def clear(self) -> None:
        t = self.w.tiers
        for loc in (t.hbm, t.dram, t.ssd):
            if loc is not None:
                self.indexer.cleared(loc)
        self._local.clear()
        self._refs.clear()


class KVEventConsumer:
    """One asyncio task per worker with ``kv_events`` configured."""

    def __init__(self, w: Worker, indexer: KVIndexer, block_tokens: int, on_batch: Callable[[], None] | None = None,
                 before_batch: Callable[[Worker], bool] | None = None) -> None:
        self.w = w
        self.before_batch = before_batch
        self.translator = BlockTranslator(w, indexer, block_tokens)
        self.stats = ConsumerStats()
        self.on_batch = on_batch
        self.last_seq: int | None = None
        self._ctx = zmq.asyncio.Context()
        self._task: asyncio.Task[None] | None = None
        self._resync = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def resync(self) -> None:
        """After a reconnect (re-admission): replay what was published since the last batch seen."""
        self._resync.set()

    async def _run(self) -> None:
        cfg = self.w.cfg
        assert cfg.kv_events is not None
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, cfg.kv_events_topic.encode())
        sub.connect(cfg.kv_events)
        # one waiter for a resync lives across messages (a message arrives every few engine steps)
        resync = asyncio.ensure_future(self._resync.wait())
        try:
            await self._replay(0)  # what the engine published before the gateway started
            while True:
                recv = asyncio.ensure_future(sub.recv_multipart())
                done, _ = await asyncio.wait({recv, resync}, return_when=asyncio.FIRST_COMPLETED)
                if resync in done:
                    self._resync.clear()
                    recv.cancel()
                    resync = asyncio.ensure_future(self._resync.wait())
                    await self._replay((self.last_seq or -1) + 1)
                    continue
                await self._message(recv.result())
        finally:
            resync.cancel()
            sub.close(linger=0)

    async def _message(self, frames: list[bytes]) -> None:
        try:
            seq, batch = decode_frames(frames)
        except KVEventError as err:
            self.stats.bad_messages += 1
            log.warning("backend %s: bad KV event message: %s", self.w.label, err)
            return
        last = self.last_seq
        if last is not None and seq <= last:
            if seq != 0 and seq >= last - RESTART_GAP:
                return  # already applied through a replay
            self.translator.clear()  # numbering restarted: so did the engine, with an empty cache
            self.last_seq = None
        elif last is not None and seq > last + 1:
            self.stats.gaps += 1
            await self._replay(last + 1)
            if self.last_seq is not None and seq <= self.last_seq:
                return
        self._apply(seq, batch)

    def _apply(self, seq: int, batch: KVEventBatch) -> None:
        if self.before_batch is not None and self.before_batch(self.w):
            log.warning("backend %s: KV events arrived from %s; routing uses them again", self.w.label, self.w.cfg.kv_events)
        self.translator.apply(batch)
        self.last_seq = seq
        self.stats.batches += 1
        self.stats.skipped_blocks = self.translator.skipped
        if self.on_batch is not None:
            self.on_batch()

    async def _replay(self, start: int) -> None:
        """Ask the replay socket for batches from ``start`` on; without one, a gap forgets the worker."""
        endpoint = self.w.cfg.kv_events_replay
        if endpoint is None:
            if start > 0:
                self.translator.clear()  # the missed batches are gone: forget rather than trust
            return
        self.stats.replays += 1
        sock = self._ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        try:
            await sock.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq < 0:
                    return
                if self.last_seq is None or seq > self.last_seq:
                    with contextlib.suppress(KVEventError):
                        self._apply(seq, decode_frames([b"", frames[1], frames[2]])[1])
        except TimeoutError:
            log.warning("backend %s: KV event replay from %s timed out", self.w.label, endpoint)
        finally:
            sock.close(linger=0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._ctx.term()
