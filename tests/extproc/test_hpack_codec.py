"""EPP's HPACK decoder against the python-hyper ``hpack`` encoder (an independent implementation), and EPP's encoder
against its decoder."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.extproc.h2.hpack import Decoder, HeaderListTooLarge, HpackError, encode_headers

_names = st.sampled_from([b":path", b":method", b"content-type", b"grpc-timeout", b"x-envoy-internal", b"te",
                          b"user-agent", b"x-custom", b"x-request-id"])
_field = st.tuples(_names, st.binary(min_size=0, max_size=300).map(lambda b: b.replace(b"\x00", b"a")))
_block = st.lists(_field, min_size=0, max_size=12)


def _expected(block: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in block]


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(_block, min_size=1, max_size=6), huffman=st.booleans(),
       table=st.sampled_from([0, 256, 4096]))
def test_decodes_what_the_hpack_package_encodes_across_blocks(blocks, huffman, table) -> None:
    """Every representation hpack's encoder chooses (indexed, incremental, Huffman or raw, table size updates
    and evictions) decodes to the same fields, block after block, with the dynamic table kept in sync."""
    encoder = hpack.Encoder()
    encoder.header_table_size = table
    decoder = Decoder()
    for block in blocks:
        data = encoder.encode(block, huffman=huffman)
        assert decoder.decode(data) == _expected(block)
    assert decoder.size <= decoder.max_size


def test_never_indexed_fields_and_sensitive_values() -> None:
    encoder = hpack.Encoder()
    block = [hpack.NeverIndexedHeaderTuple(b"authorization", b"secret"), (b"x-a", b"1")]
    decoder = Decoder()
    assert decoder.decode(encoder.encode(block)) == [(b"authorization", b"secret"), (b"x-a", b"1")]
    assert decoder.dynamic and (b"authorization", b"secret") not in decoder.dynamic


@pytest.mark.parametrize("data, message", [
    (b"\x80", "index 0 out of range"),
    (bytes([0x80 | 70]), "out of range"),
    (b"\x3f\xe2\x1f", "table size update 4097"),  # one above the advertised 4096
    (b"\x40\x85ab", "truncated"),
    (b"\x7f", "truncated"),
    (b"\x40\x84\xff\xff\xff\xff\x01a", "bad Huffman"),  # the EOS code inside a name
], ids=["index-zero", "index-beyond-table", "table-size-above-advertised", "truncated-string", "truncated-int",
        "bad-huffman"])
def test_malformed_blocks_raise(data: bytes, message: str) -> None:
    with pytest.raises(HpackError, match=message):
        Decoder().decode(data)


def test_header_list_size_is_bounded() -> None:
    block = hpack.Encoder().encode([(b"x-big", b"v" * 5000)], huffman=False)
    with pytest.raises(HpackError, match="too large"):
        Decoder(max_list_size=4096).decode(block)


def test_a_string_too_long_for_the_list_limit_is_refused_before_it_is_decoded() -> None:
    """100 KB of Huffman code can only decode to >= 26 KB: refused undecoded (decoding it would have failed on
    the EOS code it contains, with another error)."""
    length = 100_000
    block = b"\x00\x03x-a\xff" + _varint(length - 127) + b"\xff" * length
    with pytest.raises(HeaderListTooLarge):
        Decoder(max_list_size=16 << 10).decode(block)
    with pytest.raises(HpackError, match="bad Huffman"):  # the same string within the limit is decoded
        Decoder(max_list_size=1 << 20).decode(block)


def test_a_table_size_update_must_open_the_block() -> None:
    decoder = Decoder()
    assert decoder.decode(b"\x20\x3f\xe1\x1f\x82") == [(b":method", b"GET")]  # two updates, then a field
    assert decoder.max_size == 4096
    with pytest.raises(HpackError, match="after a header field"):
        decoder.decode(b"\x82\x20")


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_encoded_headers_decode_with_the_hpack_package() -> None:
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"13"),
              (b"grpc-message", b"m" * 300)]
    assert hpack.Decoder().decode(encode_headers(fields), raw=True) == fields


def test_huffman_strings_repeated_per_stream_decode_from_a_bounded_cache() -> None:
    """Envoy sends :path and :authority as Huffman literals without indexing on every stream."""
    encoder, decoder = hpack.Encoder(), Decoder()
    path = (b":path", b"/envoy.service.ext_proc.v3.ExternalProcessor/Process")
    for i in range(400):
        block = encoder.encode([hpack.NeverIndexedHeaderTuple(*path), (b"x-id", str(i).encode() * 3)])
        assert decoder.decode(block) == [path, (b"x-id", str(i).encode() * 3)]
        assert len(decoder.huffman) <= 256
