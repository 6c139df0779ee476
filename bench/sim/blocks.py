"""Paged KV cache with automatic prefix caching, modelled on vLLM V1's BlockPool.

Blocks are reference-counted. A full block is identified by a chained 64-bit hash,
`xxh3_64(parent_hash.to_bytes(8, "little") + token ids as little-endian uint32 + extra)`,
where the first block's parent is `xxh3_64(hash_seed)` and `extra` is
`b"lora\\0" + name` for a LoRA request and `b"salt\\0" + cache_salt` on block 0.
Freed blocks keep their hash and stay findable until evicted, least recently freed
first; a sequence's tail blocks are freed first so they are evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from xxhash import xxh3_64_intdigest

if TYPE_CHECKING:
    from .seq import Seq

__all__ = ["BlockManager", "root_hash"]


def root_hash(hash_seed: str) -> int:
    """Parent hash of every sequence's first block."""
    return xxh3_64_intdigest(hash_seed.encode())


def _extra_keys(seq: Seq, i: int) -> tuple[str, ...] | None:
    """vLLM's `extra_keys` of block i (`generate_block_hash_extra_keys`): the LoRA name, then
    the cache salt on block 0; None when there are none."""
    keys = ((seq.lora,) if seq.lora else ()) + ((seq.salt,) if i == 0 and seq.salt else ())
    return keys or None


class BlockManager:
    """Allocates KV blocks to sequences and keeps the prefix-cache index.

    With `record_events`, `events` collects tuples for the KV-event publisher:
    ("stored", hashes, parent_or_None, token_ids, lora_name[, extra_keys]), ("removed", hashes),
    ("cleared",). `extra_keys` (only when a block has some) is vLLM's per-block list: None, or
    the LoRA name and, on block 0, the cache salt.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        caching: bool = True,
        hash_seed: str = "0",
        record_events: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.ref = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # Blocks with ref 0 in eviction order (front first); cached ones keep their hash.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}
        self.root = root_hash(hash_seed)
        self.events: list[tuple[Any, ...]] | None = [] if record_events else None

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """Fraction of blocks held by some sequence (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self.free) / self.num_blocks

    def _hash(self, seq: Seq, i: int) -> int:
        hashes = seq.block_hashes
        bs = self.block_size
        parent = hashes[i - 1] if i else self.root
        data = parent.to_bytes(8, "little") + seq.all_ids[i * bs : (i + 1) * bs].tobytes()
        if seq.extra_key:
            data += seq.extra_key
        if i == 0 and seq.salt_key:
            data += seq.salt_key
        h = xxh3_64_intdigest(data)
        hashes.append(h)
        return h

    def lookup(self, seq: Seq) -> list[int]:
        """Blocks of the longest cached prefix, at most `seq.num_tokens - 1` tokens."""
        if not self.caching:
            return []
        hashes, cached = seq.block_hashes, self.cached
        hits: list[int] = []
        for i in range((seq.num_tokens - 1) // self.block_size):
            h = hashes[i] if i < len(hashes) else self._hash(seq, i)
            b = cached.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def allocate(self, seq: Seq, upto: int, hits: Sequence[int] = ()) -> bool:
        """Give `seq` blocks for its first `upto` tokens, reusing `hits` first.

        Returns False and changes nothing when too few blocks are free. Blocks that become
        full are registered in the prefix cache (they are computed during this step).
        """
        need = -(-upto // self.block_size) - len(seq.blocks) - len(hits)
        ref, free = self.ref, self.free
        revived = 0
        for b in hits:
            if ref[b] == 0:
                revived += 1
        if need + revived > len(free):
            return False
        blocks = seq.blocks
        for b in hits:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1
            blocks.append(b)
        if hits:
            seq.num_cached_blocks = len(blocks)
        for _ in range(need):
            b = free.popitem(last=False)[0]
            h = self.block_hash[b]
            if h is not None:
                self._evict(b, h)
            ref[b] = 1
            blocks.append(b)
        full = upto // self.block_size
        if self.caching and full > seq.num_cached_blocks:
            self._register(seq, full)
        return True

    def _evict(self, b: int, h: int) -> None:
        """Drop block ``b``'s hash ``h`` (it is being re-used)."""
        self.block_hash[b] = None
        if self.cached.get(h) == b:
            del self.cached[h]
            if self.events is not None:
                self.events.append(("removed", [h]))

    def _register(self, seq: Seq, full: int) -> None:
        hashes, cached = seq.block_hashes, self.cached
        run_start = -1
        for i in range(seq.num_cached_blocks, full):
            h = hashes[i] if i < len(hashes) else self._hash(seq, i)
            b = seq.blocks[i]
            if h in cached:  # another sequence computed the same block concurrently
                if run_start >= 0:
                    self._stored(seq, run_start, i)
                    run_start = -1
                continue
            cached[h] = b
            self.block_hash[b] = h
            if run_start < 0:
                run_start = i
        if run_start >= 0:
            self._stored(seq, run_start, full)
        seq.num_cached_blocks = full

    def _stored(self, seq: Seq, first: int, end: int) -> None:
        if self.events is None:
            return
        bs = self.block_size
        parent = seq.block_hashes[first - 1] if first else None
        event: tuple[Any, ...] = (
            "stored",
            seq.block_hashes[first:end],
            parent,
            seq.all_ids[first * bs : end * bs].tolist(),
            seq.lora,
        )
        extra = [_extra_keys(seq, i) for i in range(first, end)]
        self.events.append(event + (extra,) if any(extra) else event)

    def free_seq(self, seq: Seq) -> None:
        """Drop `seq`'s references; its blocks stay cached until evicted."""
        ref, free = self.ref, self.free
        for b in reversed(seq.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
        seq.blocks = []
        seq.num_cached_blocks = 0

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible while no block is in use (as in vLLM)."""
        if len(self.free) != self.num_blocks:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        if self.events is not None:
            self.events.append(("cleared",))
        return True

    def check(self, holders: list[Seq]) -> None:
        """Assert the allocator invariants given every sequence that holds blocks."""
        counts = [0] * self.num_blocks
        for seq in holders:
            for b in seq.blocks:
                counts[b] += 1
        assert counts == self.ref, "reference counts do not match the holders"
        assert set(self.free) == {b for b, r in enumerate(self.ref) if r == 0}, "free list"
        for h, b in self.cached.items():
            assert self.block_hash[b] == h, "cache index points at a re-used block"
