"""Tool-aware retention against a fake block pool that behaves as vLLM's: references, an LRU free
queue whose head is evicted first, and allocations that fail without side effects."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from coda.integrations.vllm.retention import Retention
from coda.integrations.vllm.settings import RetentionSettings
from coda.policy.eviction import ToolAware


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: object = None
    is_null: bool = False


class Pool:
    """vLLM's BlockPool in the parts retention uses: ``touch``, ``free_blocks`` and an LRU free queue."""

    def __init__(self, n: int) -> None:
        self.blocks = [Block(i) for i in range(n)]
        self.free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)

    def touch(self, blocks):
        for b in blocks:
            if b.ref_cnt == 0:
                del self.free[b.block_id]
            b.ref_cnt += 1

    def free_blocks(self, ordered_blocks):
        for b in ordered_blocks:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0
            if b.ref_cnt == 0:
                self.free[b.block_id] = b

    def allocate(self, n: int) -> list[Block] | None:
        """``n`` blocks from the head of the free queue (evicting their cached content), or None."""
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            _, b = self.free.popitem(last=False)
            b.block_hash, b.ref_cnt = None, 1
            out.append(b)
        return out

    def request(self, key: str, n: int) -> list[Block]:
        """A request that ran and cached ``n`` blocks (still referenced by it)."""
        blocks = self.allocate(n)
        assert blocks is not None
        for i, b in enumerate(blocks):
            b.block_hash = (key, i)
        return blocks

    def finish(self, blocks: list[Block]) -> None:
        self.free_blocks(reversed(blocks))


def retention(pool: Pool, **kw) -> Retention:
    return Retention(pool, ToolAware(min_samples=2), RetentionSettings(**kw))


def hashes(key: str, n: int) -> list[object]:
    return [(key, i) for i in range(n)]


def finish_with_tools(r: Retention, pool: Pool, key: str, n: int, tools: tuple[str, ...], now: float) -> list[Block]:
    blocks = pool.request(key, n)
    r.finished(key, (key, n - 1), blocks, tools, now)
    pool.finish(blocks)
    return blocks


def test_a_request_ending_with_a_tool_call_keeps_its_blocks_out_of_the_free_queue_until_its_session_returns():
    pool = Pool(10)
    r = retention(pool, prior_s=30.0, hold_factor=2.0)
    blocks = finish_with_tools(r, pool, "s", 4, ("bash",), now=0.0)
    assert all(b.ref_cnt == 1 and b.block_id not in pool.free for b in blocks)
    assert r.reclaimable() == 4 and r.held_requests() == 1
    (hold,) = r.events
    assert hold["event"] == "hold" and hold["hold_s"] == 60.0 and "prior" in hold["rule"]
    # the continuation extends the held prompt: the tool's duration is learned, the hold ends once it is admitted
    r.arrived("s2", [*hashes("s", 4), ("new", 0)], now=12.5)
    assert r.events[-1]["event"] == "return" and r.events[-1]["duration_s"] == 12.5
    pool.touch(blocks)  # vLLM's allocation for the continuation takes its cached prefix
    r.admitted(["s2"])
    assert r.events[-1]["event"] == "release" and r.events[-1]["rule"].startswith("returned")
    assert all(b.ref_cnt == 1 for b in blocks) and r.held_requests() == 0


def test_a_request_without_tool_calls_holds_nothing():
    pool = Pool(10)
    r = retention(pool)
    blocks = pool.request("s", 3)
    r.finished("s", ("s", 2), blocks, (), 0.0)
    pool.finish(blocks)
    assert not r.events and len(pool.free) == 10


def test_holds_expire_at_the_predicted_return_learned_per_tool():
    pool = Pool(64)
    r = retention(pool, prior_s=30.0, hold_factor=2.0, max_hold_s=100.0)
    for i, d in enumerate((4.0, 6.0)):  # two observed bash calls: mean 5 s
        finish_with_tools(r, pool, f"a{i}", 1, ("bash",), now=100.0 * i)
        r.arrived(f"b{i}", hashes(f"a{i}", 1), now=100.0 * i + d)
        r.admitted([f"b{i}"])
    finish_with_tools(r, pool, "x", 2, ("bash",), now=500.0)
    assert r.events[-1]["hold_s"] == 10.0 and "observed" in r.events[-1]["rule"]
    finish_with_tools(r, pool, "y", 2, ("pytest",), now=500.0)  # no pytest call seen: all tools' calls (5 s) are the prediction
    r.expire(509.9)
    assert r.held_requests() == 2
    r.expire(510.0)
    assert r.held_requests() == 0 and [e["rule"] for e in r.events[-2:]] == ["expired: past the predicted return"] * 2


def test_a_session_returning_after_its_hold_expired_is_still_learned():
    pool = Pool(8)
    r = retention(pool, prior_s=1.0, hold_factor=1.0)
    finish_with_tools(r, pool, "s", 2, ("sleep",), now=0.0)
    r.expire(5.0)
    r.arrived("s2", hashes("s", 3), now=90.0)
    ret = r.events[-1]
    assert ret["event"] == "return" and ret["duration_s"] == 90.0 and ret["held"] is False
    assert r.policy.remaining_s(("sleep",), 0.0) is None  # one sample, fewer than min_samples: nothing predicted yet
    r.arrived("s3", hashes("s", 3), now=95.0)  # the same prompt again is not a second return
    assert r.events[-1] is ret


def test_an_allocation_takes_held_blocks_only_after_the_free_ones_the_longest_predicted_absence_first_from_the_tail():
    pool = Pool(12)
    r = retention(pool, prior_s=30.0)
    near = finish_with_tools(r, pool, "near", 3, ("bash",), now=0.0)  # prior 30 s, out since 0
    far = finish_with_tools(r, pool, "far", 3, ("bash",), now=20.0)  # out since 20: predicted to stay out longer
    assert len(pool.free) == 6
    got = r.allocate(lambda: pool.allocate(8), now=25.0)
    assert got is not None and len(got) == 8
    # the 6 free blocks went first, then 2 of the farther session's, tail first; its leading block stays held
    assert [b.ref_cnt for b in far] == [1, 1, 1] and far[0].block_hash == ("far", 0) and [b.block_hash for b in far[1:]] == [None, None]
    assert [b.block_hash for b in near] == hashes("near", 3) and all(b.block_id not in pool.free for b in near)
    (ev,) = [e for e in r.events if e["event"] == "release"]
    assert (ev["request"], ev["blocks"], ev["kept"]) == ("far", 2, 1) and ev["rule"].startswith("pressure")
    assert r.held_requests() == 2 and r.reclaimable() == 4


def test_a_failed_allocation_leaves_every_hold_as_it_was():
    pool = Pool(6)
    r = retention(pool)
    held = finish_with_tools(r, pool, "s", 4, ("bash",), now=0.0)
    assert r.allocate(lambda: pool.allocate(7), now=1.0) is None
    assert [b.block_hash for b in held] == hashes("s", 4) and all(b.ref_cnt == 1 for b in held)
    assert not [e for e in r.events if e["event"] == "release"] and r.reclaimable() == 4


OPS = st.lists(st.one_of(
    st.tuples(st.just("finish"), st.integers(1, 4), st.sampled_from([(), ("bash",), ("grep", "sed")])),
    st.tuples(st.just("return"), st.integers(0, 30), st.just(())),
    st.tuples(st.just("allocate"), st.integers(1, 20), st.just(())),
    st.tuples(st.just("expire"), st.integers(0, 100), st.just(())),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_holds_never_leak_a_reference_and_never_make_an_allocation_fail_that_free_blocks_would_serve(ops):
    pool = Pool(20)
    r = retention(pool, prior_s=20.0, hold_factor=1.0)
    now, live, finished = 0.0, [], []
    for i, (op, n, tools) in enumerate(ops):
        now += 1.0
        if op == "finish" and len(pool.free) >= n:
            key = f"r{i}"
            finish_with_tools(r, pool, key, n, tools, now)
            finished.append((key, n))
        elif op == "return" and finished:
            key, k = finished[n % len(finished)]
            r.arrived(f"c{i}", hashes(key, k), now)
            r.admitted([f"c{i}"])
        elif op == "allocate":
            can = len(pool.free) + r.reclaimable()
            got = r.allocate(lambda n=n: pool.allocate(n), now)
            assert (got is not None) == (n <= can)  # the holds yield whatever an allocation needs
            if got is not None:
                live.append(got)
        elif op == "expire":
            r.expire(now + n)
    # every reference on a block is a live allocation's or a hold's, once each (no two own one block here)
    assert all(b.ref_cnt <= 1 for b in pool.blocks)
    assert sum(b.ref_cnt for b in pool.blocks) == sum(len(x) for x in live) + r.reclaimable()
    assert all((b.ref_cnt == 0) == (b.block_id in pool.free) for b in pool.blocks)
