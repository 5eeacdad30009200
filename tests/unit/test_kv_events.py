"""vLLM's KV-event wire format: what we publish decodes as vLLM main's structs do, and the decoder
reads every encoding vLLM has shipped (positional arrays before PR #42892, a positional batch of
map events after it, map batches on main)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.protocol.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventError,
    decode_batch,
    decode_frames,
    encode_batch,
    encode_frames,
)

u64 = st.integers(min_value=0, max_value=2**64 - 1)
hashes = st.one_of(u64, st.binary(min_size=32, max_size=32))
stored = st.builds(BlockStored, block_hashes=st.lists(hashes, min_size=1, max_size=4), parent_block_hash=st.none() | hashes,
                   token_ids=st.lists(st.integers(0, 2**31 - 1), max_size=64), block_size=st.sampled_from([16, 256]),
                   lora_id=st.none(), medium=st.sampled_from(["GPU", "CPU", None]), lora_name=st.none(),
                   group_idx=st.none() | st.integers(0, 3))
removed = st.builds(BlockRemoved, block_hashes=st.lists(hashes, min_size=1, max_size=4), medium=st.sampled_from(["GPU", "CPU", None]))
batches = st.builds(
    KVEventBatch,
    ts=st.floats(0, 2e9),
    events=st.lists(st.one_of(stored, removed, st.just(AllBlocksCleared())), max_size=5),
    data_parallel_rank=st.none() | st.integers(0, 7),
)


@given(batches)
def test_round_trip(batch):
    assert decode_batch(encode_batch(batch)) == batch


def test_events_are_tagged_maps_as_vllm_main_writes_them():
    batch = KVEventBatch(
        ts=1.5,
        events=[
            BlockStored(
                block_hashes=[7], parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None, medium="GPU", lora_name=None
            ),
            BlockRemoved(block_hashes=[7], medium="GPU"),
        ],
    )
    raw = msgspec.msgpack.decode(encode_batch(batch))
    assert raw == {
        "ts": 1.5,
        "events": [
            {
                "type": "BlockStored",
                "block_hashes": [7],
                "parent_block_hash": None,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            },
            {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"},
        ],
    }


def test_reads_the_positional_encodings_of_older_vllm():
    legacy = msgspec.msgpack.encode([2.0, [["BlockStored", [1, 2], None, [5] * 32, 16, None], ["BlockRemoved", [1]], ["AllBlocksCleared"]]])
    batch = decode_batch(legacy)
    assert batch.ts == 2.0 and batch.events[0] == BlockStored(
        block_hashes=[1, 2], parent_block_hash=None, token_ids=[5] * 32, block_size=16, lora_id=None, medium=None, lora_name=None
    )
    assert batch.events[1] == BlockRemoved(block_hashes=[1], medium=None) and batch.events[2] == AllBlocksCleared()
    between = msgspec.msgpack.encode([3.0, [{"type": "BlockRemoved", "block_hashes": [9], "medium": "CPU", "future_field": 1}], 1])
    batch = decode_batch(between)
    assert batch.events == [BlockRemoved(block_hashes=[9], medium="CPU")] and batch.data_parallel_rank == 1


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode("hello"), "map or [ts, events, rank]"),
        (msgspec.msgpack.encode([1.0, [["Nope", 1]]]), "unknown KV event type 'Nope'"),
        (msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "x"}]]), "malformed BlockRemoved"),
        (msgspec.msgpack.encode({"ts": "late", "events": []}), "numeric ts"),
    ],
)
def test_malformed_payloads_raise_one_clear_error(payload, needle):
    with pytest.raises(KVEventError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        decode_batch(payload)


def test_frames_carry_topic_and_big_endian_sequence():
    batch = KVEventBatch(ts=1.0, events=[AllBlocksCleared()])
    frames = encode_frames(b"kv", 258, batch)
    assert frames[0] == b"kv" and frames[1] == b"\x00" * 6 + b"\x01\x02"
    assert decode_frames(list(frames)) == (258, batch)
    with pytest.raises(KVEventError, match="3 frames"):
        decode_frames([b"kv", frames[2]])
