"""Extra keys in precise prefix-cache keys: a request's ``cache_salt`` and multimodal items on one side, a
``BlockStored`` event's ``extra_keys`` on the other (``epp/kvcache/extra.py``).

Where the expected values come from:

* vLLM (``kv_cache_utils.generate_block_hash_extra_keys``): block i's extra keys are ``[lora_name]`` for a LoRA
  request, then the identifier of every multimodal item whose placeholder range overlaps the block (older vLLM:
  ``(identifier, offset - block start)``), then ``cache_salt`` when i == 0; ``None`` when empty. ``BlockStored``
  carries that list, one entry per block (``block_pool.cache_full_blocks``). :func:`vllm_extra_keys` builds it so.
* llm-d (``preciseprefixcache/blockkeys.go`` ``computeBlockKeys`` + ``foldCacheSalt``; ``kvblock`` ``ComputeBlock
  ExtraFeatures``, ``ParseRawExtraKeys(raw, loraName)``, ``TokensToKVBlockKeys``): request side, per block the
  hashes of the overlapping items then the salt on block 0; event side, per block the strings (a pair's first item)
  minus a leading name equal to the event's ``lora_name``; each block's key is
  ``FNV-64a(canonical CBOR [parent, tokens, extras])`` with extras ``null`` or ``[{"Hash": h}, ...]`` (Go's
  ``[]MMHash``), the chain rooted at ``FNV-64a(CBOR [FNV-64a(hashSeed), null, model])``. :func:`llmd_keys` is that
  algorithm, written out here from the Go source.
* EPP's own layout (``epp/kvcache/index.py``): ``key = xxh3_64(LE64(parent) ‖ LE32 tokens ‖ (LE64(len e) ‖ e)...)``.

EPP's keys are not llm-d's bytes (they stay inside EPP's index), so the agreement test checks what matters: for the
same request and the same engine events, EPP finds exactly as many blocks as llm-d's keys would match.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import xxhash

from epp.framework.request import MultiModalFeature
from epp.kvcache import KVBlockIndex, TokenProcessor, apply_events, decode_batch, longest_prefix, request_extras
from epp.kvcache.events import EventDecodeError
from epp.kvcache.extra import parse_extra_keys, parse_mm_features, realign

BLOCK = 16
MODEL = "m"
TOKENS = list(range(1000, 1000 + 4 * BLOCK))  # four full blocks
_MASK = 2**64 - 1


def image(h: str, offset: int, length: int) -> MultiModalFeature:
    return MultiModalFeature("image", h, offset, length)


# ------------------------------------------------------------------ the layout of EPP's keys


def _le64(n: int) -> bytes:
    return n.to_bytes(8, "little")


def _tokens(chunk: list[int]) -> bytes:
    return b"".join(t.to_bytes(4, "little") for t in chunk)


def test_a_salted_first_block_hashes_the_salt_after_its_tokens() -> None:
    """Derivation: root = xxh3(LE64(xxh3(seed)) ‖ model); block 0 = xxh3(LE64(root) ‖ tokens ‖ LE64(5) ‖ "alice");
    blocks 1.. = xxh3(LE64(prev) ‖ tokens), as without a salt (whose chain therefore differs from block 0 on)."""
    tp = TokenProcessor(BLOCK, "seed")
    root = xxhash.xxh3_64_intdigest(_le64(xxhash.xxh3_64_intdigest(b"seed")) + MODEL.encode())
    k0 = xxhash.xxh3_64_intdigest(_le64(root) + _tokens(TOKENS[:16]) + _le64(5) + b"alice")
    k1 = xxhash.xxh3_64_intdigest(_le64(k0) + _tokens(TOKENS[16:32]))
    assert tp.keys(TOKENS[:32], MODEL, extras=[("alice",), None]) == [k0, k1]
    plain = tp.keys(TOKENS[:32], MODEL)
    assert plain[0] == xxhash.xxh3_64_intdigest(_le64(root) + _tokens(TOKENS[:16]))
    assert tp.keys(TOKENS[:32], MODEL, extras=[None, None]) == tp.keys(TOKENS[:32], MODEL, extras=[(), ()]) == plain


def test_extra_keys_are_length_prefixed() -> None:
    """("ab", "c") and ("abc",) are different extras: each key carries its byte length (llm-d's xxh64 layout)."""
    tp = TokenProcessor(BLOCK)
    assert tp.keys(TOKENS[:16], MODEL, extras=[("ab", "c")]) != tp.keys(TOKENS[:16], MODEL, extras=[("abc",)])


# ------------------------------------------------------------------ request side


@pytest.mark.parametrize("blocks,salt,features,expected", [
    (4, None, (), None),
    (4, "", (), None),  # vLLM salts only a non-empty cache_salt
    (0, "alice", (), None),  # no full block, nothing to salt (foldCacheSalt's numBlocks == 0)
    (3, "alice", (), [("alice",), None, None]),
    # an image on tokens 4..23 overlaps blocks 0 and 1; the salt comes after block 0's image hash
    (3, None, (image("A", 4, 20),), [("A",), ("A",), None]),
    (3, "alice", (image("A", 4, 20),), [("A", "alice"), ("A",), None]),
    # an image ending exactly at token 32 is not in block 2; one starting at 32 is not in block 1
    (3, None, (image("A", 16, 16), image("B", 32, 4)), [None, ("A",), ("B",)]),
    # two items in one block, given out of order: prompt order
    (1, None, (image("B", 9, 2), image("A", 1, 2)), [("A", "B")]),
    # an item past the last full block taints nothing
    (2, None, (image("A", 40, 8),), None),
], ids=["plain", "empty-salt", "no-block", "salt", "image", "image+salt", "boundaries", "order", "past-the-end"])
def test_request_extras(blocks: int, salt: str | None, features: tuple[MultiModalFeature, ...],
                        expected: list[Any] | None) -> None:
    assert request_extras(blocks, BLOCK, salt, features) == expected


# ------------------------------------------------------------------ event side


@pytest.mark.parametrize("raw,lora,expected", [
    (None, None, None),
    ([None, None], None, None),  # vLLM's text-only blocks
    ([["alice"], None], None, [("alice",), None]),
    ([["sql", "alice"], ["sql"]], "sql", [("alice",), None]),  # the LoRA name roots the chain instead
    ([["img", "sql"]], "sql", [("img", "sql")]),  # only a leading LoRA name is dropped
    ([["other", "img"]], "sql", [("other", "img")]),
    ([["sql"]], None, [("sql",)]),
    ([[["A", 4]], [["A", -12], "alice"]], None, [("A",), ("A", "alice")]),  # older vLLM's (identifier, offset)
    ([[7, "A", b"\x01" * 32]], None, [("A",)]),  # integer LoRA ids and prompt-embedding digests are skipped
], ids=["absent", "all-none", "salt", "lora-stripped", "lora-not-first", "other-lora", "no-lora-name",
        "legacy-pairs", "skipped-types"])
def test_parse_extra_keys(raw: Any, lora: str | None, expected: list[Any] | None) -> None:
    assert parse_extra_keys(raw, lora) == expected


@pytest.mark.parametrize("raw", [5, "alice", [5], [{"a": 1}]], ids=["int", "string", "int-entry", "map-entry"])
def test_malformed_extra_keys_make_the_batch_undecodable(raw: Any) -> None:
    with pytest.raises(ValueError):
        parse_extra_keys(raw, None)
    payload = msgpack.packb({"ts": 1.0, "events": [_stored([1], None, TOKENS[:16], extra_keys=raw)]})
    with pytest.raises(EventDecodeError):
        decode_batch(payload)


def test_realign_follows_llmds_mapping() -> None:
    """llm-d's realignExtraFeatures: equal counts as they are; a larger engine block's extras go to every EPP block
    in it; smaller engine blocks' extras are concatenated into the EPP block they fall in."""
    assert realign([("a",), None], 2) == [("a",), None]
    assert realign([("a",), ("b",)], 4) == [("a",), ("a",), ("b",), ("b",)]
    assert realign([("a",), ("b",), None, ("c",)], 2) == [("a", "b"), ("c",)]
    assert realign(None, 2) is None and realign([("a",)], 0) is None


# ------------------------------------------------------------------ agreement with llm-d


def _fnv64a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & _MASK
    return h


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
    raise ValueError(n)


def _cbor(obj: Any) -> bytes:
    """Canonical CBOR (RFC 7049 §3.9) of what llm-d's chain hashes: unsigned ints, strings, arrays, maps, null."""
    if obj is None:
        return b"\xf6"
    if isinstance(obj, int):
        return _head(0, obj)
    if isinstance(obj, str):
        raw = obj.encode()
        return _head(3, len(raw)) + raw
    if isinstance(obj, list):
        return _head(4, len(obj)) + b"".join(_cbor(x) for x in obj)
    items = sorted((_cbor(k), _cbor(v)) for k, v in obj.items())
    items.sort(key=lambda kv: len(kv[0]))  # canonical: shorter keys first, then bytewise
    return _head(5, len(items)) + b"".join(k + v for k, v in items)


def llmd_keys(tokens: list[int], model: str, extras: list[Any] | None, seed: str = "") -> list[int]:
    """llm-d's TokensToKVBlockKeys (cbor-fnv, the default) from the root: one key per full block."""
    prev = _fnv64a(_cbor([_fnv64a(seed.encode()), None, model]))
    out = []
    for i in range(len(tokens) // BLOCK):
        ex = extras[i] if extras else None
        prev = _fnv64a(_cbor([prev, tokens[i * BLOCK:(i + 1) * BLOCK], [{"Hash": h} for h in ex] if ex else None]))
        out.append(prev)
    return out


def llmd_request_extras(salt: str, features: tuple[MultiModalFeature, ...]) -> list[Any] | None:
    """computeBlockKeysForTokens: ComputeBlockExtraFeatures (items overlapping each block, by start), then
    foldCacheSalt (the salt appended to block 0)."""
    n = len(TOKENS) // BLOCK
    out: list[Any] = [None] * n
    for f in sorted(features, key=lambda f: f.offset):
        for i in range(n):
            if f.offset + f.length > i * BLOCK and f.offset < (i + 1) * BLOCK:
                out[i] = (out[i] or []) + [f.hash]
    if salt:
        out[0] = (out[0] or []) + [salt]
    return out if any(out) else None


def llmd_event_extras(raw: list[Any], lora: str) -> list[Any]:
    """ParseRawExtraKeys(raw, loraName): strings and a pair's first item, a leading loraName dropped."""
    out: list[Any] = []
    for entry in raw:
        keys = [k if isinstance(k, str) else k[0] for j, k in enumerate(entry or [])
                if (isinstance(k, str) and not (j == 0 and lora and k == lora)) or isinstance(k, list)]
        out.append(keys or None)
    return out


def vllm_extra_keys(salt: str, features: tuple[MultiModalFeature, ...], lora: str = "",
                    legacy: bool = False) -> list[Any]:
    """BlockStored.extra_keys for the prompt's blocks, as generate_block_hash_extra_keys builds them."""
    out: list[Any] = []
    for i in range(len(TOKENS) // BLOCK):
        start, end = i * BLOCK, (i + 1) * BLOCK
        keys: list[Any] = [lora] if lora else []
        for f in features:
            if end > f.offset and start < f.offset + f.length:
                keys.append([f.hash, f.offset - start] if legacy else f.hash)
        if i == 0 and salt:
            keys.append(salt)
        out.append(keys or None)
    return out


def _stored(hashes: list[int], parent: int | None, tokens: list[int], lora: str | None = None,
            extra_keys: Any = None) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": BLOCK, "lora_id": 1 if lora else None, "medium": "GPU", "lora_name": lora,
            "extra_keys": extra_keys}


SERVED = "10.0.0.1:8000"
A, B = image("img-A", 20, 20), image("img-B", 20, 20)  # blocks 1 and 2


@pytest.mark.parametrize("req_salt,req_mm,srv_salt,srv_mm,lora,legacy", [
    ("", (), "", (), "", False),
    ("alice", (), "alice", (), "", False),
    ("", (), "alice", (), "", False),
    ("alice", (), "", (), "", False),
    ("alice", (), "bob", (), "", False),
    ("", (A,), "", (A,), "", False),
    ("", (A,), "", (B,), "", False),
    ("alice", (A,), "alice", (A,), "", False),
    ("alice", (A,), "alice", (A,), "", True),
    ("alice", (), "alice", (), "sql-lora", False),
    ("", (), "alice", (), "sql-lora", False),
], ids=["plain", "same-salt", "unsalted-vs-salted", "salted-vs-unsalted", "other-salt", "same-image",
        "other-image", "image+salt", "image+salt-legacy-pairs", "lora+salt", "lora-unsalted-vs-salted"])
def test_epp_matches_exactly_the_blocks_llmds_keys_match(req_salt: str, req_mm: tuple[MultiModalFeature, ...],
                                                         srv_salt: str, srv_mm: tuple[MultiModalFeature, ...],
                                                         lora: str, legacy: bool) -> None:
    """A server stored the prompt's four blocks for a request with ``srv_*``; a request with ``req_*`` asks. llm-d
    matches the leading blocks whose request key equals the key it derived from the event; EPP (its event path and
    its request keys) finds that many blocks, no more, no fewer."""
    model = lora or MODEL
    raw = vllm_extra_keys(srv_salt, srv_mm, lora, legacy)
    want = llmd_keys(TOKENS, model, llmd_request_extras(req_salt, req_mm))
    got = llmd_keys(TOKENS, model, llmd_event_extras(raw, lora))
    llmd_matched = next((i for i, (w, g) in enumerate(zip(want, got)) if w != g), len(want))

    tp, index = TokenProcessor(BLOCK), KVBlockIndex()
    payload = msgpack.packb({"ts": 1.0, "events": [_stored([11, 12, 13, 14], None, TOKENS, lora or None, raw)]})
    apply_events(index, tp, SERVED, MODEL, decode_batch(payload))
    keys = tp.keys(TOKENS, model, extras=request_extras(len(TOKENS) // BLOCK, BLOCK, req_salt, req_mm))
    epp_matched = longest_prefix(index.lookup(keys))[1].get(SERVED, 0)

    assert epp_matched == llmd_matched
    same = (req_salt, req_mm) == (srv_salt, srv_mm)
    assert llmd_matched == (4 if same else 1 if req_salt == srv_salt else 0)


def test_a_salted_chain_continues_from_its_parent_without_the_salt() -> None:
    """vLLM salts only the block at token 0: a later BlockStored continuing the chain has no salt in its extra
    keys, and its blocks follow the salted parent's key, so the whole salted prompt matches and nothing else."""
    tp, index = TokenProcessor(BLOCK), KVBlockIndex()
    batch = [_stored([11, 12], None, TOKENS[:32], extra_keys=[["alice"], None]),
             _stored([13, 14], 12, TOKENS[32:], extra_keys=[None, None])]
    apply_events(index, tp, SERVED, MODEL, decode_batch(msgpack.packb({"ts": 1.0, "events": batch})))
    salted = tp.keys(TOKENS, MODEL, extras=request_extras(4, BLOCK, "alice"))
    assert longest_prefix(index.lookup(salted))[1] == {SERVED: 4}
    assert longest_prefix(index.lookup(tp.keys(TOKENS, MODEL)))[1] == {}


# ------------------------------------------------------------------ the render's multimodal features


def test_render_features_become_items_in_prompt_order() -> None:
    """vLLM's render answer (``MultiModalFeatures``: per modality, hashes and placeholder ranges in parallel)."""
    raw = {"mm_hashes": {"image": ["h1", "h2"], "audio": ["h3"]},
           "mm_placeholders": {"image": [{"offset": 40, "length": 8}, {"offset": 3, "length": 10}],
                               "audio": [{"offset": 20, "length": 5}]},
           "kwargs_data": None}
    assert parse_mm_features(raw) == (MultiModalFeature("image", "h2", 3, 10),
                                      MultiModalFeature("audio", "h3", 20, 5), MultiModalFeature("image", "h1", 40, 8))


@pytest.mark.parametrize("raw", [None, [], {"mm_hashes": {"image": ["h"]}},
                                 {"mm_hashes": {"image": "h"}, "mm_placeholders": {"image": []}},
                                 {"mm_hashes": {"image": ["h"]}, "mm_placeholders": {"image": [{"offset": "0"}]}}],
                         ids=["absent", "not-a-map", "no-placeholders", "hashes-not-a-list", "bad-range"])
def test_absent_or_malformed_render_features_give_none(raw: Any) -> None:
    assert parse_mm_features(raw) == ()
