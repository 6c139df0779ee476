"""Tokenizers for the simulator, the chat template, and the generated output text.

The built-in `ByteTokenizer` is deliberately trivial so that a gateway can reproduce it
exactly: the UTF-8 bytes of the text, zero-padded to a multiple of four, read as
little-endian uint32 values, one token per four bytes (about the usual four characters
per token). A shared text prefix of n bytes is a shared token prefix of n // 4 tokens.
"""

from __future__ import annotations

import random
import sys
from array import array
from typing import Any, Protocol

import orjson

__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "OutputText",
    "Tokenizer",
    "apply_chat_template",
    "load_tokenizer",
]

assert array("I").itemsize == 4

_WORDS = (
    "the and for you not but all any can had her was one our out day get has him his how man "
    "new now old see two way who boy did its let put say she too use big end far few got lot "
    "may own run set sun top try win yes yet ago air art bed car cup dog eat eye fun"
).split()


class Tokenizer(Protocol):
    """Turns text into token ids and token ids back into text."""

    name: str

    def encode(self, text: str) -> array:
        """Token ids of `text` as an `array("I")`."""
        ...

    def decode(self, ids: Any) -> str:
        """Text of a sequence of token ids."""
        ...


class ByteTokenizer:
    """Four UTF-8 bytes per token (little-endian uint32); deterministic and fast."""

    name = "sim-bytes4"

    def encode(self, text: str) -> array:
        data = text.encode()
        pad = -len(data) & 3
        if pad:
            data += b"\0" * pad
        ids = array("I")
        ids.frombytes(data)
        if sys.byteorder == "big":
            ids.byteswap()
        return ids

    def decode(self, ids: Any) -> str:
        arr = array("I", ids)
        if sys.byteorder == "big":
            arr.byteswap()
        return arr.tobytes().rstrip(b"\0").decode(errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from a tokenizer.json file."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as _HF  # optional dependency
        except ImportError as exc:
            raise RuntimeError("tokenizer files need the 'tokenizers' package") from exc
        self._tok = _HF.from_file(path)
        self.name = path

    def encode(self, text: str) -> array:
        return array("I", self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Any) -> str:
        return self._tok.decode(list(ids))


def load_tokenizer(path: str | None) -> Tokenizer:
    """The built-in tokenizer for None, else the Hugging Face tokenizer at `path`."""
    return ByteTokenizer() if path is None else HFTokenizer(path)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"<{part.get('type', 'part')}>")
        return "".join(parts)
    raise ValueError("message content must be a string or a list of parts")


def apply_chat_template(messages: list[dict[str, Any]]) -> str:
    """Render chat messages as `<|role|>\\ncontent\\n` each, then `<|assistant|>\\n`."""
    out = []
    for msg in messages:
        if not isinstance(msg, dict) or "role" not in msg:
            raise ValueError("each message needs a 'role'")
        out.append(f"<|{msg['role']}|>\n{_content_text(msg.get('content'))}\n")
    out.append("<|assistant|>\n")
    return "".join(out)


class OutputText:
    """A fixed cycle of generated tokens; a request's output is a window into it.

    Output for a request is a pure function of (seed, prompt), so identical prompts get
    identical completions (like greedy decoding) and their generated blocks share hashes.
    Slicing a precomputed string keeps the per-token cost near zero.
    """

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, length: int = 4096) -> None:
        rng = random.Random(seed)
        words = [w + " " for w in rng.choices(_WORDS, k=length)]
        if isinstance(tokenizer, ByteTokenizer):
            ids = tokenizer.encode("".join(words))
            pieces = words
        else:
            ids = tokenizer.encode("".join(words))[:length]
            pieces = [tokenizer.decode([i]) for i in ids]
        self.length = n = len(ids)
        self._ids = ids + ids
        self._text = "".join(pieces) * 2
        # copied to their exact size: orjson returns each result in a 4 KiB buffer, 16 MiB for the whole cycle
        self._json = [bytes(memoryview(orjson.dumps(p))) for p in pieces]
        offs = [0] * (2 * n + 1)
        acc = 0
        for i, piece in enumerate(pieces + pieces):
            acc += len(piece)
            offs[i + 1] = acc
        self._offs = offs

    def ids(self, start: int, count: int) -> array:
        """Token ids of output positions [0, count) for a request whose cycle offset is `start`."""
        out = array("I")
        start %= self.length
        while count > 0:
            n = min(count, self.length)
            out.extend(self._ids[start : start + n])
            count -= n
        return out

    def token_id(self, start: int, index: int) -> int:
        """Id of output token number `index`."""
        return self._ids[(start + index) % self.length]

    def text(self, start: int, first: int, count: int) -> str:
        """Text of output tokens [first, first + count)."""
        pos = (start + first) % self.length
        parts = []
        while count > 0:
            n = min(count, self.length)
            parts.append(self._text[self._offs[pos] : self._offs[pos + n]])
            count -= n
        return "".join(parts)

    def pieces(self, start: int, first: int, count: int) -> list[str]:
        """Text of each output token in [first, first + count), one string per token."""
        text, offs, n = self._text, self._offs, self.length
        pos = (start + first) % n
        out = []
        for i in range(pos, pos + count):
            j = i % n
            out.append(text[offs[j] : offs[j + 1]])
        return out

    def json_pieces(self, start: int, first: int, count: int) -> list[bytes]:
        """Like `pieces`, as JSON string literals (quoted and escaped)."""
        js, n = self._json, self.length
        pos = start + first
        return [js[i % n] for i in range(pos, pos + count)]
