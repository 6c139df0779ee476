"""gRPC message framing shared by the gRPC parsers: the reference's util/grpc_test.go cases for request bodies,
and response streams reassembled across chunk boundaries."""

from __future__ import annotations

import pytest

from epp.errors import BadRequest
from epp.plugins.parsers._wire import GrpcFrames, grpc_payload, request_path


@pytest.mark.parametrize("data,error", [
    (bytes([0, 0, 0, 0]), "invalid gRPC frame: expected at least 5 bytes for header, got 4"),
    (bytes([1, 0, 0, 0, 0]), "compressed gRPC payload is not supported"),
    (bytes([0, 0, 0, 0, 10]) + b"12345", "incomplete gRPC payload: header indicates 10 bytes, but only 5 bytes are "
                                         "available"),
    (bytes([0, 0xFF, 0xFF, 0xFF, 0xFF, 0xAA, 0xBB, 0xCC, 0xDD]),
     "incomplete gRPC payload: header indicates 4294967295 bytes, but only 4 bytes are available"),
], ids=["too-short-header", "compressed", "incomplete", "length-near-uint32-max"])
def test_bad_frames_are_bad_requests_with_the_reference_message(data: bytes, error: str) -> None:
    with pytest.raises(BadRequest) as info:
        grpc_payload(data)
    assert info.value.message == error and info.value.status == 400


def test_a_frame_of_exact_size_gives_its_message_and_trailing_bytes_are_ignored() -> None:
    assert grpc_payload(bytes([0, 0, 0, 0, 5]) + b"hello") == b"hello"
    assert grpc_payload(bytes([0, 0, 0, 0, 5]) + b"hello" + bytes([0, 0, 0, 0, 1]) + b"x") == b"hello"


def _frame(data: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(data).to_bytes(4, "big") + data


@pytest.mark.parametrize("split", [1, 3, 5, 6, 9, 100], ids=lambda n: f"chunks-of-{n}")
def test_response_messages_are_reassembled_whatever_the_chunking(split: int) -> None:
    stream = _frame(b"one") + _frame(b"") + _frame(b"compressed", flag=1) + _frame(b"three")
    frames = GrpcFrames()
    got = []
    for i in range(0, len(stream), split):
        got.extend(frames.feed(stream[i:i + split]))
    assert got == [b"one", b"", b"three"]  # the compressed message is skipped, its bytes consumed


@pytest.mark.parametrize("path,headers,expected", [
    ("/v1/x?a=1", {"x-original-path": "/other"}, "/v1/x"),
    ("", {"x-original-path": "/generate?q", "x-forwarded-path": "/f"}, "/generate"),
    ("", {"x-forwarded-path": "/f"}, "/f"),
    ("", {}, ""),
], ids=["path", "original-path", "forwarded-path", "none"])
def test_request_path_falls_back_to_the_original_path_headers(path: str, headers: dict, expected: str) -> None:
    assert request_path(path, headers) == expected
