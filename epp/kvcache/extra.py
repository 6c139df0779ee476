"""Extra keys: what besides its tokens makes a prompt block different (the request's ``cache_salt``, the images or
other media whose placeholder tokens it holds).

vLLM hashes each full block over ``(parent hash, token ids, extra_keys)``, so two requests with the same tokens but
another salt or another image share no block from there on. A block's extras here are a tuple of strings, folded
into its request key (:class:`~epp.kvcache.index.TokenProcessor`): for a request (:func:`request_extras`) the hash of
every multimodal item overlapping the block, then the salt on block 0; for an event (:func:`parse_extra_keys`) its
``extra_keys`` strings. The LoRA adapter is never an extra key: its name roots the chain. A request's multimodal
items come from vLLM's ``features``: :func:`parse_mm_features`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from epp.framework.request import MultiModalFeature

__all__ = ["BlockExtras", "request_extras", "parse_extra_keys", "realign", "parse_mm_features"]

BlockExtras = tuple[str, ...]
"""One block's extra keys, in order; absent (None) for a plain block."""


def request_extras(num_blocks: int, block_size: int, cache_salt: str | None,
                   features: Iterable[MultiModalFeature] = ()) -> list[BlockExtras | None] | None:
    """Per full block of a prompt (``num_blocks`` of ``block_size`` tokens): the hashes of the multimodal items whose
    placeholder range overlaps it, ordered by offset, and ``cache_salt`` (when non-empty) after them on block 0.
    None when no block has any (a plain text prompt), as llm-d's ``foldCacheSalt`` leaves it."""
    if num_blocks <= 0 or not (cache_salt or features):
        return None
    out: list[BlockExtras | None] = [None] * num_blocks
    for f in sorted(features, key=lambda f: f.offset):
        # the blocks i with i*size < end and (i+1)*size > offset (llm-d's overlap test)
        first = max(f.offset // block_size, 0)
        last = min(-(-(f.offset + max(f.length, 0)) // block_size) - 1, num_blocks - 1)
        for i in range(first, last + 1):
            out[i] = (out[i] or ()) + (f.hash,)
    if cache_salt:
        out[0] = (out[0] or ()) + (cache_salt,)
    return out if any(out) else None


def parse_extra_keys(raw: Any, lora_name: str | None) -> list[BlockExtras | None] | None:
    """A ``BlockStored`` event's ``extra_keys`` as per-block extras (llm-d's ``ParseRawExtraKeys``); None when the
    event has none or no block keeps any. Raises ``ValueError`` when it is not an array of arrays (or nulls)."""
    if raw is None:
        return None
    if not isinstance(raw, (list, tuple)):
        raise ValueError("BlockStored.extra_keys is not an array")
    out = [_block_extras(entry, lora_name) for entry in raw]
    return out if any(out) else None


def _block_extras(entry: Any, lora_name: str | None) -> BlockExtras | None:
    if entry is None:
        return None
    if not isinstance(entry, (list, tuple)):
        raise ValueError("a BlockStored.extra_keys entry is not an array")
    keys: list[str] = []
    for i, key in enumerate(entry):
        if isinstance(key, str):
            if i == 0 and lora_name and key == lora_name:
                continue  # vLLM's LoRA key: the name already roots the chain
            keys.append(key)
        elif isinstance(key, (list, tuple)) and key and isinstance(key[0], str):
            keys.append(key[0])  # (identifier, offset in block): older vLLM's multimodal key
    return tuple(keys) or None


def realign(extras: Sequence[BlockExtras | None] | None, count: int) -> list[BlockExtras | None] | None:
    """Engine-block extras mapped onto ``count`` EPP blocks when the block sizes differ, as llm-d's
    ``realignExtraFeatures``: fewer engine blocks (larger ones) give each EPP block the extras of the engine block
    it falls in; more (smaller ones) give each EPP block its engine blocks' extras one after another."""
    if extras is None or count <= 0:
        return None
    n = len(extras)
    if n == 0 or n == count:
        return list(extras)
    if n < count:
        return [extras[i * n // count] for i in range(count)]
    out: list[BlockExtras | None] = [None] * count
    for i, ex in enumerate(extras):
        if ex:
            j = i * count // n
            out[j] = (out[j] or ()) + ex
    return out


def parse_mm_features(raw: Any) -> tuple[MultiModalFeature, ...]:
    """vLLM's render ``features`` (``{"mm_hashes": {modality: [hash]}, "mm_placeholders": {modality: [{"offset",
    "length"}]}}``) as items ordered by offset, the i-th hash of a modality paired with its i-th range; () when
    absent or malformed."""
    if not isinstance(raw, dict):
        return ()
    hashes, ranges = raw.get("mm_hashes"), raw.get("mm_placeholders")
    if not isinstance(hashes, dict) or not isinstance(ranges, dict):
        return ()
    items: list[MultiModalFeature] = []
    for modality, values in hashes.items():
        spans = ranges.get(modality)
        if not isinstance(values, list) or not isinstance(spans, list):
            return ()
        for value, span in zip(values, spans):
            offset = span.get("offset") if isinstance(span, dict) else None
            length = span.get("length") if isinstance(span, dict) else None
            if not isinstance(value, str) or type(offset) is not int or type(length) is not int or offset < 0:
                return ()
            items.append(MultiModalFeature(str(modality), value, offset, length))
    return tuple(sorted(items, key=lambda f: f.offset))
