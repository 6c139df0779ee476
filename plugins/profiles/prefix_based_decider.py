"""``prefix-based-pd-decider``: prefill separately only when the decode endpoint lacks much of the prompt.

Formula (``N`` = ``nonCachedTokens``, ``P`` = ``promptTokens``)::

    N == 0                                   -> decode only (disaggregation off)
    input = len(prompt text) // 4            # chat: the serialized messages
    P > 0 and input < P                      -> decode only (prompt-length gate; 0 = off)
    input < N                                -> decode only
    no prefix match info                     -> decode only
    cached = matchBlocks(decode endpoint) * blockSizeTokens
    input - cached < N                       -> decode only
    otherwise                                -> prefill + decode

Match info comes from ``approx-prefix-cache-producer`` (auto-created when absent), or from the one
``prefixMatchInfoProducerName`` names.

YAML::

    - type: prefix-based-pd-decider
      parameters:
        nonCachedTokens: 16
        promptTokens: 0
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, PdDecider
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import CHARS_PER_TOKEN, InferenceRequest, utf8_len

from ..producers.approx_prefix_cache import PRODUCER_TYPE, PrefixMatch, find_prefix_producer

__all__ = ["PrefixBasedPdDecider"]


class PrefixBasedPdDecider:
    """Disaggregates when at least ``nonCachedTokens`` of a prompt of at least ``promptTokens`` are not cached on
    the decode endpoint."""

    type_name: ClassVar[str] = "prefix-based-pd-decider"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PluginParams):
        non_cached_tokens: int = Field(0, alias="nonCachedTokens", ge=0)
        prompt_tokens: int = Field(0, alias="promptTokens", ge=0)
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._threshold = params.non_cached_tokens
        self._min_prompt = params.prompt_tokens
        self._key = ""

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No producer parameters of its own: an auto-created producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        name = self.params.prefix_match_info_producer_name
        self._key = find_prefix_producer(self, handle, producer_name=name).state_key

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, decode_endpoint: Endpoint) -> bool:
        threshold = self._threshold
        if threshold == 0:
            return False
        input_tokens = utf8_len(request.prompt_text) // CHARS_PER_TOKEN  # bytes, as the reference and the blocks
        if input_tokens < self._min_prompt or input_tokens < threshold:
            return False
        state = cycle.get(self._key)
        if not isinstance(state, PrefixMatch):
            return False
        return input_tokens - state.cached_tokens(decode_endpoint.name) >= threshold


_check: type[PdDecider] = PrefixBasedPdDecider
