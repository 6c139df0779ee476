from epp._pb.envoy.service.discovery.v3 import discovery_pb2 as _discovery_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class EdsDummy(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
