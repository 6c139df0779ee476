"""EPP's own CPU per ext_proc request, without gRPC: the ext_proc ``Stream`` driven directly.

Each request is the message sequence Envoy sends in FULL_DUPLEX_STREAMED mode (request headers, a 4 KB chat body
with end of stream, response headers, a JSON response body with usage) through a fresh ``Stream`` over a
``Director`` with the default profile and 16 endpoints, with and without ``EppMetrics``. What this measures is
everything EPP does per request (parse, admission, schedule, hooks, metrics, protocol replies) except grpc.aio's
own per-stream and per-message work, so ``bench/extproc.py``'s CPU per request minus this is gRPC's share.

Usage: python -m bench.extproc_path [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson
from prometheus_client import CollectorRegistry

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.config.loader import DEFAULT_CONFIG_TEXT, build_pipeline, load_raw
from epp.datalayer.datastore import Datastore
from epp.extproc.stream import Stream, StreamSettings
from epp.framework.endpoint import EndpointSpec, Metrics
from epp.metrics.families import EppMetrics
from epp.runtime.builtins import default_registry
from epp.scheduling.director import Director

FULL_DUPLEX = 4  # ProcessingMode.FULL_DUPLEX_STREAMED
RESPONSE = b'{"model":"m","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":64}}'


def _headers(pairs: dict[str, str]) -> base_pb2.HeaderMap:
    hm = base_pb2.HeaderMap()
    for key, value in pairs.items():
        hm.headers.add(key=key, raw_value=value.encode())
    return hm


def _messages(i: int) -> list[pb.ProcessingRequest]:
    head = pb.ProcessingRequest()
    head.request_headers.headers.CopyFrom(_headers({":method": "POST", ":path": "/v1/chat/completions",
                                                    "content-type": "application/json"}))
    head.protocol_config.request_body_mode = FULL_DUPLEX  # type: ignore[assignment]
    head.protocol_config.response_body_mode = FULL_DUPLEX  # type: ignore[assignment]
    body = pb.ProcessingRequest()
    body.request_body.body = orjson.dumps({"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": "s" * 3000 + str(i % 16)}, {"role": "user", "content": "q" * 900 + str(i)}]})
    body.request_body.end_of_stream = True
    resp_head = pb.ProcessingRequest()
    resp_head.response_headers.headers.CopyFrom(_headers({":status": "200", "content-type": "application/json"}))
    resp_body = pb.ProcessingRequest()
    resp_body.response_body.body = RESPONSE
    resp_body.response_body.end_of_stream = True
    return [head, body, resp_head, resp_body]


def _director(with_metrics: bool) -> Director:
    pipeline = build_pipeline(*load_raw(DEFAULT_CONFIG_TEXT), default_registry(entry_points=False))
    store = Datastore()
    store.replace_all(EndpointSpec(name=f"ep{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(16))
    for ep in store.endpoints():
        ep.metrics = Metrics(waiting=ep.port % 7, kv_usage=0.3, update_time=time.monotonic())
    store.mark_synced()
    metrics = EppMetrics(CollectorRegistry()) if with_metrics else None
    if metrics is not None:
        pipeline.scheduler.timer = metrics.plugin_duration
    return Director(pipeline, store, metrics=metrics)


async def _run(with_metrics: bool, requests: int) -> float:
    settings = StreamSettings(_director(with_metrics), 10 << 20, None, None)
    batches = [_messages(i) for i in range(requests)]

    async def one(messages: list[pb.ProcessingRequest]) -> None:
        stream = Stream(settings)
        for msg in messages:
            stream.handle(msg)
            if stream.route_pending:
                await stream.route()

    warm = requests // 10
    for messages in batches[:warm]:
        await one(messages)
    start = time.process_time()
    for messages in batches[warm:]:
        await one(messages)
    return (time.process_time() - start) / (requests - warm) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    args = parser.parse_args()
    for with_metrics in (False, True):
        cpu = asyncio.run(_run(with_metrics, args.requests))
        print(f"EPP request path without gRPC, {'with' if with_metrics else 'without'} metrics: {cpu:.0f} µs/request")


if __name__ == "__main__":
    main()
