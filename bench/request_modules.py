"""Which of EPP's modules one ext_proc request crosses, from Envoy's first message to the pick and back.

A real ext_proc server (EPP's own HTTP/2 transport, plaintext, on 127.0.0.1) with the default profile over 16
endpoints gets one warm-up exchange and then one measured exchange from a grpc.aio client, in one process. While the
measured exchange runs, a profile hook notes:

* **the path**: every ``epp`` module with a frame on the call stack when the Director is called, when a picker
  runs, or when EPP writes to a socket: the modules that hand the request along;
* **executed**: every ``epp`` module (plugins and generated protobuf modules apart) with any function called,
  helpers included.

Usage: python -m bench.request_modules
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from types import FrameType
from typing import Any

import grpc

from bench.extproc_path import _director, _messages
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.extproc.server import ExtProcServer

METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _ours(module: str) -> bool:
    return module.startswith("epp.") and not module.startswith(("epp._pb", "epp.plugins"))


class Recorder:
    """The profile hook: modules executed, and the modules on the stack at each hand-off point."""

    def __init__(self) -> None:
        self.path: set[str] = set()
        self.executed: set[str] = set()
        self.plugins: set[str] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = _module(frame)
        if _ours(module):
            self.executed.add(module)
        elif module.startswith(("epp.plugins", "plugins.")):
            self.plugins.add(module)
        if self._hand_off(module, frame.f_code.co_name):
            self._note_stack(frame)

    @staticmethod
    def _hand_off(module: str, function: str) -> bool:
        # Matched by the last name parts, so that a tree from before the re-packaging (epp.director,
        # plugins.pickers) can be measured by the same script for a before/after comparison.
        return (module.endswith(".director") or ".pickers." in f".{module}"
                or (module == "asyncio.selector_events" and function == "write"))

    def _note_stack(self, frame: FrameType | None) -> None:
        while frame is not None:
            if _ours(_module(frame)):
                self.path.add(_module(frame))
            frame = frame.f_back


async def _exchange(channel: grpc.aio.Channel, index: int) -> int:
    call = channel.stream_stream(METHOD, request_serializer=pb.ProcessingRequest.SerializeToString,
                                 response_deserializer=pb.ProcessingResponse.FromString)

    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for message in _messages(index):
            yield message

    replies = 0
    async for _ in call(requests()):
        replies += 1
    return replies


async def measure() -> Recorder:
    server = ExtProcServer(_director(False), host="127.0.0.1", port=0, health_port=None, plaintext=True)
    await server.start()
    recorder = Recorder()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            await _exchange(channel, 0)  # warm-up: imports, caches, the connection
            sys.setprofile(recorder)
            try:
                replies = await _exchange(channel, 1)
            finally:
                sys.setprofile(None)
            assert replies >= 4, replies  # headers, body, response headers, response body answered
    finally:
        await server.stop(0)
    return recorder


def main() -> None:
    recorder = asyncio.run(measure())
    print(f"modules on the path from the first message to the pick and back: {len(recorder.path)}")
    for module in sorted(recorder.path):
        print(f"  {module}")
    helpers = sorted(recorder.executed - recorder.path)
    print(f"other epp modules with code run for the request: {len(helpers)}")
    for module in helpers:
        print(f"  {module}")
    print(f"plugin modules run: {len(recorder.plugins)}")


if __name__ == "__main__":
    main()
