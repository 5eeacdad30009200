"""vLLM's KV-cache event wire format, shared by the fake engine (publisher) and the gateway (consumer).

Mirrors ``vllm/distributed/kv_events.py`` as of vLLM main (commit 0181ea31, read for this
module; nothing is copied): a ZMQ PUB socket sends multipart messages ``(topic, seq, payload)``
where ``seq`` is a batch counter starting at 0 as 8 big-endian bytes and ``payload`` is a
msgpack ``KVEventBatch``. Events are msgspec Structs tagged with their class name and encoded as
maps (the tag under ``"type"``); block hashes are ``int`` or ``bytes`` (vLLM's
``ExternalBlockHash``). A ROUTER replay socket answers a request frame holding a start sequence
number (8 big-endian bytes) with ``(seq, payload)`` for every buffered batch from there on, then
``(-1, b"")``.

vLLM has changed this encoding twice: releases before vLLM PR #42892 sent events (and the
batch) as positional arrays (``array_like=True``), and releases after it but before main kept
the batch positional (``[ts, events, data_parallel_rank]``) with map events. ``decode_batch``
accepts all three, so the gateway can consume any vLLM that publishes events; ``encode_batch``
writes what vLLM main writes.
"""

from __future__ import annotations

from typing import Any

import msgspec

ExternalBlockHash = int | bytes
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_DISK = "DISK"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVEventError(ValueError):
    """A payload that is not a KV event batch in any vLLM encoding."""


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of every KV-cache event; the tag is the class name."""


class BlockStored(KVCacheEvent):
    """Consecutive blocks of one sequence became resident; ``token_ids`` holds all their tokens."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    """The events of one engine step."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_TYPES: dict[str, type[KVCacheEvent]] = {c.__name__: c for c in (BlockStored, BlockRemoved, AllBlocksCleared)}


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch in any of vLLM's encodings (map or positional batch; map or positional events)."""
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError:
        pass
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as err:
        raise KVEventError(f"KV event payload is not msgpack: {err}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) in (2, 3):
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) == 3 else None
    else:
        raise KVEventError(f"KV event batch must be a map or [ts, events, rank] array, got {type(raw).__name__}")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise KVEventError("KV event batch needs a numeric ts and a list of events")
    return KVEventBatch(ts=float(ts), events=[_event(e) for e in events], data_parallel_rank=rank)


def _event(raw: Any) -> KVCacheEvent:
    if isinstance(raw, dict):
        name = raw.get("type")
    elif isinstance(raw, list) and raw:
        name = raw[0]
    else:
        raise KVEventError(f"a KV event must be a tagged map or array, got {raw!r:.80}")
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise KVEventError(f"unknown KV event type {name!r}; known: {', '.join(_TYPES)}")
    if isinstance(raw, dict):
        fields = {k: v for k, v in raw.items() if k != "type"}
    else:
        fields = dict(zip(cls.__struct_fields__, raw[1:]))
    # Fields an older vLLM did not send yet (medium, lora_name) are absent, which means None.
    for f in cls.__struct_fields__:
        fields.setdefault(f, None)
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as err:
        raise KVEventError(f"malformed {name} event: {err}") from None


def encode_frames(topic: bytes, seq: int, batch: KVEventBatch) -> tuple[bytes, bytes, bytes]:
    """The PUB multipart message for batch number ``seq``."""
    return topic, seq.to_bytes(8, "big"), encode_batch(batch)


def decode_frames(frames: list[bytes]) -> tuple[int, KVEventBatch]:
    """``(seq, batch)`` from a received PUB message ``(topic, seq, payload)``."""
    if len(frames) != 3:
        raise KVEventError(f"a KV event message has 3 frames (topic, seq, payload), got {len(frames)}")
    return int.from_bytes(frames[1], "big", signed=True), decode_batch(frames[2])
