"""Prompt ids assembled from cached sections: a rendered prompt split at the tokenizer's added tokens.

A Hugging Face tokenizer takes its added tokens (``<|im_start|>``, ``<|user|>``, ...) out of the text first and
encodes the sections between them one by one, so for most tokenizers a prompt's ids are its sections' ids with
the added tokens' ids between them. Chat templates put an added token at every message boundary, so a long system
prompt or a conversation's history is a section that many requests repeat. :class:`SegmentCache` keeps sections'
ids (LRU, at most ``max_tokens`` ids in all, keyed by a 16-byte digest of the text) and encodes only new ones.
Some tokenizers do not split that way (a SentencePiece ``Metaspace`` that prepends only at the start of the input;
added tokens that strip the whitespace beside them): the cache is off for a tokenizer with such added tokens, and
the first ``VERIFY_FIRST`` prompts and one in ``VERIFY_EVERY`` after are also encoded whole and compared; a
difference turns it off for good (logged, counted in :attr:`mismatches`) and that prompt gets the whole encoding.
"""

from __future__ import annotations

import logging
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable
from hashlib import blake2b
from typing import Any

__all__ = ["SegmentCache"]

log = logging.getLogger(__name__)

VERIFY_FIRST = 32
VERIFY_EVERY = 64

class SegmentCache:
    """Section-by-section encoding with an LRU of sections' ids (see the module doc)."""

    def __init__(self, tokenizer: Any, max_tokens: int) -> None:
        added = tokenizer.get_added_tokens_decoder()
        self._ids = {t.content: i for i, t in added.items()}
        plain = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values())
        self.enabled = max_tokens > 0 and bool(self._ids) and plain
        longest_first = sorted(self._ids, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if self._ids else None
        self.max_tokens = max_tokens
        self._lru: OrderedDict[bytes, array] = OrderedDict()
        self.tokens = 0
        self.prompts = 0
        self.hits = 0
        self.misses = 0
        self.mismatches = 0

    async def encode(self, text: str, encode: Callable[[list[str]], Any]) -> list[int] | None:
        """The ids of ``text`` from cached and newly encoded sections, or None when the cache is off (the caller
        then encodes the whole text). ``encode`` (texts -> their ids, without special tokens) is awaited once with
        every text that needs encoding."""
        if not self.enabled or self._split is None:
            return None
        self.prompts += 1
        parts = [p for p in self._split.split(text) if p]
        keys = [None if p in self._ids else blake2b(p.encode(), digest_size=16).digest() for p in parts]
        have, missing = self._lookup(keys, parts)
        verify = self.prompts <= VERIFY_FIRST or self.prompts % VERIFY_EVERY == 0
        texts = list(missing.values()) + ([text] if verify else [])
        encoded = await encode(texts) if texts else []
        for new, ids in zip(missing, encoded):
            have[new] = piece = array("I", ids)
            self._store(new, piece)
        out = array("I")
        for key, part in zip(keys, parts):
            if key is None:
                out.append(self._ids[part])
            else:
                out.extend(have[key])
        if verify and list(out) != list(encoded[-1]):
            return self._mismatch(encoded[-1])
        return out.tolist()

    def _lookup(self, keys: list[bytes | None], parts: list[str]) -> tuple[dict[bytes, array], dict[bytes, str]]:
        """The cached sections' ids (taken now: another prompt may evict them while this one awaits its encoding)
        and the text of the sections to encode, each once."""
        have: dict[bytes, array] = {}
        missing: dict[bytes, str] = {}
        for key, part in zip(keys, parts):
            if key is None or key in have or key in missing:
                continue
            piece = self._lru.get(key)
            if piece is None:
                missing[key] = part
            else:
                have[key] = piece
                self._lru.move_to_end(key)
        self.hits += len(have)
        self.misses += len(missing)
        return have, missing

    def _store(self, key: bytes, piece: array) -> None:
        if len(piece) > self.max_tokens:
            return
        old = self._lru.pop(key, None)
        self.tokens += len(piece) - (len(old) if old is not None else 0)
        self._lru[key] = piece
        while self.tokens > self.max_tokens:
            _, evicted = self._lru.popitem(last=False)
            self.tokens -= len(evicted)

    def _mismatch(self, whole: list[int]) -> list[int]:
        self.mismatches += 1
        self.enabled = False
        self._lru.clear()
        self.tokens = 0
        log.warning("this tokenizer does not encode a prompt as the concatenation of the sections between its added "
                    "tokens; encoding every prompt whole from now on")
        return list(whole)
