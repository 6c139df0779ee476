"""``always-disagg-multimodal-decider``: an encode stage for requests with media parts, loaded from an E/P/D
config as llm-d's README writes it and driving ``disagg-profile-handler`` through a real scheduler."""

from __future__ import annotations

import orjson
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.framework.plugins import CycleState
from epp.framework.request import parse_request
from epp.plugins.profiles.always_disagg_multimodal_decider import AlwaysDisaggMultimodalDecider

from .helpers import ep, make, registry

EPD = """
plugins:
- type: encode-filter
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: max-score-picker
- type: always-disagg-pd-decider
- type: always-disagg-multimodal-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: always-disagg-pd-decider
      encode: always-disagg-multimodal-decider
schedulingProfiles:
- name: encode
  plugins: [{pluginRef: encode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
TEXT = {"type": "text", "text": "What is in this picture?"}


def chat(*parts: dict) -> bytes:  # type: ignore[type-arg]
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": list(parts)}]})


@pytest.mark.parametrize("path, body, expected", [
    ("/v1/chat/completions", chat(TEXT, IMAGE), True),
    ("/v1/chat/completions", chat(TEXT, {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}}),
     True),
    ("/v1/chat/completions", chat(TEXT, {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}), True),
    ("/v1/chat/completions", chat(TEXT), False),
    ("/v1/chat/completions", orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), False),
    ("/v1/completions", orjson.dumps({"model": "m", "prompt": "image_url"}), False),
    ("/v1/responses", orjson.dumps({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "describe"}, {"type": "input_image", "image_url": "https://x/i.png"}]}]}),
     True),
    ("/v1/messages", orjson.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]}]}), True),
], ids=["image", "audio", "video", "text-parts", "text-string", "completions", "responses-image", "messages-image"])
def test_decides_by_media_parts(path: str, body: bytes, expected: bool) -> None:
    request = parse_request(path, body, {})
    assert make(AlwaysDisaggMultimodalDecider).disaggregate(CycleState(), request, ep("d")) is expected


def test_epd_config_runs_the_encode_stage_for_images_only() -> None:
    pipeline = build_pipeline(*load_raw(EPD, "epd.yaml"), registry())
    pool = [ep("e", role="encode", address="10.0.0.1"), ep("p", role="prefill", address="10.0.0.2"),
            ep("d", role="decode", address="10.0.0.3")]
    handler = pipeline.scheduler.handler

    with_image = parse_request("/v1/chat/completions", chat(TEXT, IMAGE), {})
    result = pipeline.scheduler.schedule(with_image, pool)
    for hook in pipeline.pre_request:
        hook.pre_request(with_image, result)
    assert result.target.name == "d" and result.prefill is not None and result.prefill.name == "p"
    assert result.headers["x-encoder-hosts-ports"] == "10.0.0.1:8000"

    text_only = parse_request("/v1/chat/completions", chat(TEXT), {})
    result = pipeline.scheduler.schedule(text_only, pool)
    assert "encode" not in result.profile_results and result.prefill is not None
    assert handler.decisions == {"encode_prefill_decode": 1, "prefill_decode": 1}  # type: ignore[attr-defined]
