"""``always-disagg-multimodal-decider`` (llm-d): a separate encode step for every request that carries an image,
audio or video, and none for text-only requests.

``disagg-profile-handler`` asks it through ``deciders.encode``: yes when any message content part (chat
completions and Anthropic Messages ``messages``, or a Responses request's ``input`` items) is of a media type
vLLM's renderer takes: ``image_url``, ``video_url``, ``input_audio``, ``audio_url``, ``image``, ``input_image``.
llm-d's README lists the first three; its current code asks the token producer's rendered prompt for multimodal
features, which come from the same parts. No parameters.

YAML::

    - type: always-disagg-multimodal-decider
    - type: disagg-profile-handler
      parameters:
        deciders: {encode: always-disagg-multimodal-decider}
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, NoParams, PdDecider
from epp.framework.request import InferenceRequest, has_media

__all__ = ["AlwaysDisaggMultimodalDecider"]


class AlwaysDisaggMultimodalDecider:
    """Answers "disaggregate" exactly when the request has a media content part."""

    type_name: ClassVar[str] = "always-disagg-multimodal-decider"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, decode_endpoint: Endpoint) -> bool:
        body = request.body
        return has_media(body.get("messages")) or has_media(body.get("input"))


_check: type[PdDecider] = AlwaysDisaggMultimodalDecider
