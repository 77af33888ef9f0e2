"""The block pool on CPU, with exact block ids and free-queue order."""

import pytest

from worker.engine import block_manager
from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence
from worker.sampling_params import SamplingParams

BLOCK = 4


def _seq(tokens: list[int], index: int = 0) -> Sequence:
    return Sequence(str(index), tokens, SamplingParams(), arrival_index=index)


def _computed(pool: BlockManager, tokens: list[int], index: int = 0) -> Sequence:
    """A sequence whose whole prompt has been run, its full blocks registered."""
    seq = _seq(tokens, index)
    assert pool.allocate_slots(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    pool.register_computed_blocks(seq)
    return seq


def test_allocation_takes_blocks_from_the_front_in_order() -> None:
    pool = BlockManager(num_blocks=11, block_size=BLOCK, enable_prefix_caching=True)
    seq = _seq(list(range(10)))
    assert pool.allocate_slots(seq, 10)
    assert seq.block_ids == [0, 1, 2]
    assert pool.num_free_blocks == 8
    assert [b.ref_count for b in pool.blocks[:4]] == [1, 1, 1, 0]


def test_allocation_that_does_not_fit_changes_nothing() -> None:
    pool = BlockManager(num_blocks=3, block_size=BLOCK, enable_prefix_caching=False)
    seq = _seq(list(range(13)))
    assert not pool.allocate_slots(seq, 13)
    assert seq.block_ids == []
    assert pool.num_free_blocks == 3
    assert not pool.allocate_slots(_seq([1]), 1, reserved_blocks=3)


def test_free_returns_tail_first_and_uncached_blocks_go_to_the_front() -> None:
    pool = BlockManager(num_blocks=11, block_size=BLOCK, enable_prefix_caching=True)
    seq = _computed(pool, list(range(10)))  # blocks 0, 1 full; block 2 partial
    pool.free(seq)
    # Block 2 had no hash: reused first. Cached 1 then 0 sit at the end, tail first.
    assert list(pool.free_queue) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 0]
    assert all(b.ref_count == 0 for b in pool.blocks)


def test_prefix_hit_reuses_cached_blocks_and_stops_one_token_short() -> None:
    pool = BlockManager(num_blocks=11, block_size=BLOCK, enable_prefix_caching=True)
    _computed(pool, list(range(12)))

    same = _seq(list(range(12)), 1)
    hits = pool.get_computed_blocks(same)
    # All three blocks match, but the last token must be recomputed: two blocks hit.
    assert hits == [0, 1]
    assert pool.allocate_slots(same, 12, hits)
    assert same.block_ids == [0, 1, 3]
    assert [pool.blocks[i].ref_count for i in (0, 1, 2, 3)] == [2, 2, 1, 1]
    assert pool.prefix_cache_hits == 8

    other = _seq([99, *range(1, 12)], 2)
    assert pool.get_computed_blocks(other) == []


def test_freed_cached_block_is_revived_or_lazily_evicted() -> None:
    pool = BlockManager(num_blocks=3, block_size=BLOCK, enable_prefix_caching=True)
    pool.free(_computed(pool, list(range(9))))
    assert list(pool.free_queue) == [2, 1, 0]

    # A hit on a free cached block takes it out of the free queue.
    again = _seq(list(range(9)), 1)
    hits = pool.get_computed_blocks(again)
    assert hits == [0, 1]
    assert pool.allocate_slots(again, 9, hits)
    assert again.block_ids == [0, 1, 2]
    pool.free(again)

    # A different sequence needs every block: the cached hashes are evicted.
    stranger = _seq([7] * 12, 2)
    assert pool.allocate_slots(stranger, 12)
    assert pool.cached_blocks == {}
    assert pool.get_computed_blocks(_seq(list(range(9)), 3)) == []


@pytest.mark.parametrize("caching", [True, False])
def test_shared_blocks_are_freed_only_when_the_last_user_leaves(caching: bool) -> None:
    pool = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=caching)
    a, b = _computed(pool, list(range(9)), 0), _seq(list(range(9)), 1)
    pool.allocate_slots(b, 9, pool.get_computed_blocks(b))
    shared = 2 if caching else 0
    assert pool.num_free_blocks == 8 - 6 + shared
    pool.free(a)
    assert pool.num_free_blocks == 8 - 3
    pool.free(b)
    assert pool.num_free_blocks == 8
    assert all(block.ref_count == 0 for block in pool.blocks)


def test_can_admit_respects_the_watermark() -> None:
    pool = BlockManager(num_blocks=10, block_size=BLOCK, enable_prefix_caching=False)
    assert pool.can_admit(40)
    assert not pool.can_admit(41)
    assert pool.can_admit(36, reserved_blocks=1)
    assert not pool.can_admit(37, reserved_blocks=1)
    assert pool.usage == 0.0


def test_a_digest_collision_never_shares_another_prefixs_blocks(monkeypatch) -> None:
    """Forced collisions: a hit must hold the same tokens after the same parent block."""
    # Every block collides with every other: different tokens never hit.
    monkeypatch.setattr(block_manager, "block_digest", lambda parent, tokens: b"same")
    pool = BlockManager(num_blocks=12, block_size=BLOCK, enable_prefix_caching=True)
    _computed(pool, list(range(12)))
    assert pool.get_computed_blocks(_seq([99, *range(1, 12)], 1)) == []
    assert pool.get_computed_blocks(_seq(list(range(12)), 2)) == [0]

    # Digests blind to the parent: equal tokens after different prefixes collide.
    blind = lambda parent, tokens: bytes(str(list(tokens)), "ascii")  # noqa: E731
    monkeypatch.setattr(block_manager, "block_digest", blind)
    pool = BlockManager(num_blocks=12, block_size=BLOCK, enable_prefix_caching=True)
    first = _computed(pool, [0, 1, 2, 3, 4, 5, 6, 7, 8])
    second = _computed(pool, [20, 21, 22, 23, 4, 5, 6, 7, 8], 1)
    hits = pool.get_computed_blocks(_seq([20, 21, 22, 23, 4, 5, 6, 7, 9], 2))
    # Its first block is the second prompt's; the next one, though its digest and
    # tokens match, follows the first prompt's first block: not this prefix.
    assert hits == [second.block_ids[0]]
    assert first.block_ids[1] not in hits


def test_block_digests_chain_the_whole_prefix() -> None:
    tokens = [4, 5, 6, 7]
    assert block_manager.block_digest(None, tokens) == block_manager.block_digest(None, tokens)
    assert block_manager.block_digest(b"a", tokens) != block_manager.block_digest(b"b", tokens)
    assert block_manager.block_digest(None, [2**40]) != block_manager.block_digest(None, [0])
