"""The KV block pool: allocation, ref counts, and prefix caching.

Blocks hold ``block_size`` token slots each. A full block is identified by a
SHA-256 digest of (parent block's digest, its token ids), so two sequences that
share a prefix share its blocks. A hit is also checked against the block's own
token ids and parent block, so even a colliding digest never lets one request
(or tenant) attend to another's KV: Python's ``hash()`` of tuples, used here
before, collides by design. Freed blocks keep their hash and wait in an LRU free
queue; they are evicted (their hash forgotten) only when a block is needed.

Free queue order (front is taken first):

    [ freed blocks without a hash | cached blocks, least recently freed first ]

A finished sequence frees its blocks tail first, so the end of a prompt is
evicted before its beginning, which other prompts are likelier to share. A sequence of
a model whose every layer slides gives back the blocks wholly before its window as it
goes (``release_before``), so a long generation holds a bounded number of blocks.
"""

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence as Tokens
from dataclasses import dataclass

from worker.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    # What the cached block holds: checked on every hit.
    token_ids: tuple[int, ...] = ()
    parent_id: int | None = None


def block_digest(parent: bytes | None, token_ids: Tokens[int]) -> bytes:
    """The prefix-cache key of a full block: its tokens and, through the parent's
    digest, every token before them."""
    return hashlib.sha256((parent or b"") + array("q", token_ids).tobytes()).digest()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_blocks: dict[bytes, int] = {}  # block digest -> block id
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # prompt tokens found

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running sequences."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def can_admit(self, num_tokens: int, reserved_blocks: int = 0) -> bool:
        """Whether a new sequence of ``num_tokens`` fits while keeping ``reserved_blocks`` free."""
        return self.blocks_needed(num_tokens) <= self.num_free_blocks - reserved_blocks

    def _hash_full_blocks(self, seq: Sequence) -> None:
        tokens, size = seq.token_ids, self.block_size
        for i in range(len(seq.block_hashes), len(tokens) // size):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(block_digest(parent, tokens[i * size : (i + 1) * size]))

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold the start of a sequence that has no blocks yet.

        The hit stops one token short of the whole sequence: the last token
        must be recomputed to produce logits.
        """
        if not self.enable_prefix_caching or seq.block_ids:
            return []
        self._hash_full_blocks(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        size = self.block_size
        for i, block_hash in enumerate(seq.block_hashes[:max_blocks]):
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None:
                break
            block = self.blocks[block_id]
            parent = hits[-1] if hits else None
            if block.parent_id != parent or block.token_ids != tuple(
                seq.token_ids[i * size : (i + 1) * size]
            ):
                break  # a digest collision: not this prefix
            hits.append(block_id)
        return hits

    def allocate_slots(
        self,
        seq: Sequence,
        num_tokens: int,
        computed_blocks: list[int] | None = None,
        reserved_blocks: int = 0,
    ) -> bool:
        """Give ``seq`` room for ``num_tokens`` tokens in total; False if the pool is short.

        ``computed_blocks`` (prefix-cache hits) are attached first; a hit that
        sits in the free queue counts against free space since it leaves it.
        Nothing changes when the answer is False.
        """
        computed_blocks = computed_blocks or []
        new_blocks = self.blocks_needed(num_tokens) - len(seq.block_ids) - len(computed_blocks)
        revived = sum(1 for b in computed_blocks if self.blocks[b].ref_count == 0)
        if max(new_blocks, 0) + revived > self.num_free_blocks - reserved_blocks:
            return False
        if not seq.block_ids:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += len(computed_blocks) * self.block_size
        for block_id in computed_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            seq.block_ids.append(block_id)
        seq.num_registered_blocks = len(seq.block_ids)
        for _ in range(new_blocks):
            seq.block_ids.append(self._take_free_block())
        return True

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            # Lazy eviction: the hash is forgotten only now that the block is reused.
            if self.cached_blocks.get(block.block_hash) == block_id:
                del self.cached_blocks[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block_id

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Make the sequence's newly full, computed blocks findable by their hash."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
            return
        self._hash_full_blocks(seq)
        size = self.block_size
        for i in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_ids[i]]
            block_hash = seq.block_hashes[i]
            if block.block_hash is None and block_hash not in self.cached_blocks:
                block.block_hash = block_hash
                block.token_ids = tuple(seq.token_ids[i * size : (i + 1) * size])
                block.parent_id = seq.block_ids[i - 1] if i else None
                self.cached_blocks[block_hash] = block.block_id
        seq.num_registered_blocks = num_full

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first."""
        for block_id in reversed(seq.block_ids[seq.num_released_blocks :]):
            self._release(block_id)
        seq.block_ids = []
        seq.num_registered_blocks = 0
        seq.num_released_blocks = 0

    def release_before(self, seq: Sequence, first_key: int) -> None:
        """Give back the sequence's blocks that hold only keys before ``first_key``
        (the first its next token attends to), oldest first."""
        keep_from = min(max(0, first_key) // self.block_size, len(seq.block_ids))
        if self.enable_prefix_caching:  # hashed first: registering reads the block later
            keep_from = min(keep_from, seq.num_registered_blocks)
        for block_id in seq.block_ids[seq.num_released_blocks : keep_from]:
            self._release(block_id)
        seq.num_released_blocks = max(seq.num_released_blocks, keep_from)

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue[block_id] = None
            if block.block_hash is None:
                self.free_queue.move_to_end(block_id, last=False)
