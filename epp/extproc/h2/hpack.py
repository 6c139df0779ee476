"""HPACK (RFC 7541) for EPP's own HTTP/2 server: a decoder for what Envoy sends, an encoder for what EPP answers.

The decoder implements the whole representation set with a dynamic table bounded by the size EPP advertises. The
header list size is checked before each string is decoded: a string whose shortest possible decoding would pass the
limit is refused undecoded. Huffman-coded strings are decoded with the ``hpack`` package's table; everything else is
here because that package's decoder costs several times more per header block, on every stream
(docs/benchmarks.md). The encoder writes literals without indexing and without Huffman coding: EPP sends three or
four short headers per stream, so a dynamic table would save a few bytes at the price of state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

__all__ = ["DEFAULT_TABLE_SIZE", "Decoder", "HeaderListTooLarge", "HpackError", "encode_headers"]

DEFAULT_TABLE_SIZE = 4096
_STATIC: tuple[tuple[bytes, bytes], ...] = tuple(HeaderTable.STATIC_TABLE)
_STATIC_LEN = len(_STATIC)
_ENTRY_OVERHEAD = 32
_HUFFMAN_CACHE = 256


class HpackError(ValueError):
    """A header block that cannot be decoded: the connection must end with COMPRESSION_ERROR."""


class HeaderListTooLarge(HpackError):
    """The header list passes ``max_list_size``; decoding stopped there, so the HPACK state is lost as well."""


class Decoder:
    """One connection's HPACK decoding context; :meth:`decode` must see every header block, in order."""

    __slots__ = ("dynamic", "huffman", "max_list_size", "max_size", "room", "size")

    def __init__(self, max_size: int = DEFAULT_TABLE_SIZE, max_list_size: int = 64 << 10) -> None:
        self.max_size = max_size
        self.size = 0
        self.dynamic: deque[tuple[bytes, bytes]] = deque()
        self.max_list_size = max_list_size
        self.room = max_list_size  # of the block being decoded: what its strings may still add
        # Decoded Huffman strings by their coded bytes: Envoy sends every stream's :path and :authority as
        # Huffman literals *without* indexing, so the same few strings would otherwise be decoded per stream.
        self.huffman: dict[bytes, bytes] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The header fields of one complete block (HEADERS plus CONTINUATION payloads), in order."""
        out: list[tuple[bytes, bytes]] = []
        pos, end = 0, len(block)
        self.room = self.max_list_size
        while pos < end:
            b = block[pos]
            if b & 0x80:
                index, pos = _integer(block, pos, 7)
                field = self._field(index)
            elif b & 0xC0 == 0x40:
                field, pos = self._literal(block, pos, 6)
                self._insert(field)
            elif b & 0xE0 == 0x20:
                if out:  # RFC 7541 §4.2: only at the beginning of a block
                    raise HpackError("dynamic table size update after a header field")
                new_size, pos = _integer(block, pos, 5)
                if new_size > DEFAULT_TABLE_SIZE:
                    raise HpackError(f"table size update {new_size} above the advertised {DEFAULT_TABLE_SIZE}")
                self.max_size = new_size
                self._evict()
                continue
            else:
                field, pos = self._literal(block, pos, 4)
            self.room -= len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
            if self.room < 0:
                raise HeaderListTooLarge("header list too large")
            out.append(field)
        return out

    def _field(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_LEN:
            return _STATIC[index - 1]
        try:
            if index > _STATIC_LEN:
                return self.dynamic[index - _STATIC_LEN - 1]
        except IndexError:
            pass
        raise HpackError(f"header index {index} out of range")

    def _literal(self, block: bytes, pos: int, prefix: int) -> tuple[tuple[bytes, bytes], int]:
        index, pos = _integer(block, pos, prefix)
        if index:
            name = self._field(index)[0]
        else:
            name, pos = self._string(block, pos)
        value, pos = self._string(block, pos)
        return (name, value), pos

    def _string(self, block: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(block):
            raise HpackError("truncated string")
        huffman = block[pos] & 0x80
        length, pos = _integer(block, pos, 7)
        if (length if not huffman else length * 8 // 30) + _ENTRY_OVERHEAD > self.room:
            raise HeaderListTooLarge("header list too large")  # checked before decoding anything of it
        end = pos + length
        if end > len(block):
            raise HpackError("truncated string")
        raw = block[pos:end]
        if not huffman:
            return raw, end
        cache = self.huffman
        text = cache.get(raw)
        if text is None:
            try:
                text = decode_huffman(raw)
            except HPACKDecodingError as exc:
                raise HpackError(f"bad Huffman string: {exc}") from None
            if len(cache) >= _HUFFMAN_CACHE:
                cache.clear()
            cache[raw] = text
        return text, end

    def _insert(self, field: tuple[bytes, bytes]) -> None:
        self.dynamic.appendleft(field)
        self.size += len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
        self._evict()

    def _evict(self) -> None:
        while self.size > self.max_size and self.dynamic:
            name, value = self.dynamic.pop()
            self.size -= len(name) + len(value) + _ENTRY_OVERHEAD


def _integer(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    mask = (1 << prefix) - 1
    try:
        value = block[pos] & mask
        pos += 1
        if value < mask:
            return value, pos
        shift = 0
        while True:
            b = block[pos]
            pos += 1
            value += (b & 0x7F) << shift
            if not b & 0x80:
                return value, pos
            shift += 7
            if shift > 28:
                raise HpackError("integer too large")
    except IndexError:
        raise HpackError("truncated integer") from None


def encode_headers(fields: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A header block of literals without indexing (raw strings); ``:status 200`` uses its static index."""
    out = bytearray()
    for name, value in fields:
        if name == b":status" and value == b"200":
            out.append(0x88)
            continue
        out.append(0x00)
        _put_string(out, name)
        _put_string(out, value)
    return bytes(out)


def _put_string(out: bytearray, data: bytes) -> None:
    n = len(data)
    if n < 0x7F:
        out.append(n)
    else:
        out.append(0x7F)
        n -= 0x7F
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    out += data
