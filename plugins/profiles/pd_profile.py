"""``pd-profile-handler`` (deprecated): P/D disaggregation, mapped onto ``disagg-profile-handler``.

Same stages, primary and headers as ``disagg-profile-handler`` (profiles ``decodeProfile``/``prefillProfile``). The
prefill decision is taken by the decider plugin ``deciderPluginName`` names; else, with no ``threshold``, by a
configured ``prefix-based-pd-decider``; else by v0.3.0's length-based rule on the decode endpoint's prefix match::

    prompt    = len(prompt text)                                   # UTF-8 bytes, as Go's len()
    cached    = min(matchBlocks * block bytes, prompt)
    prompt - cached < threshold  -> decode only, else prefill + decode
                                   (threshold 0, the default, always disaggregates)

Unlike ``disagg-profile-handler``, a prefill that found no endpoint leaves the request decode-only.

YAML::

    - type: prefill-header-handler
    - type: pd-profile-handler
      parameters:
        threshold: 10
        hashBlockSize: 5
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from pydantic import Field, model_validator

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Profile, ProfileHandler, ProfileRunResult, SchedulingResult
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest, utf8_len

from ..producers.approx_prefix_cache import PRODUCER_TYPE, PrefixMatch, find_prefix_producer
from .data_parallel import route_to_primary_port
from .disagg_profile import DisaggProfileHandler, DisaggStages

__all__ = ["DEFAULT_DECIDER", "PdProfileHandler"]

DEFAULT_DECIDER = "prefix-based-pd-decider"
"""llm-d HEAD's default ``deciderPluginName`` (``pd_profile_handler.go``)."""


class _ThresholdDecider:
    """v0.3.0's rule: disaggregate unless fewer than ``threshold`` prompt bytes are uncached."""

    type_name: ClassVar[str] = "pd-profile-handler-threshold"

    def __init__(self, name: str, threshold: int, state_key: str) -> None:
        self.name = name
        self.threshold = threshold
        self.state_key = state_key

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, decode_endpoint: Endpoint) -> bool:
        prompt = utf8_len(request.prompt_text)  # bytes, as v0.3.0's Go len() and the prefix blocks
        state = cycle.get(self.state_key)
        cached = 0
        if isinstance(state, PrefixMatch):
            cached = min(state.match_blocks(decode_endpoint.name) * state.block_chars, prompt)
        return prompt - cached >= self.threshold


class PdProfileHandler(DisaggProfileHandler):
    """Deprecated P/D handler: ``disagg-profile-handler`` with a decider plugin (HEAD) or v0.3.0's threshold rule."""

    type_name: ClassVar[str] = "pd-profile-handler"
    decider_fields: ClassVar[dict[str, str]] = {"prefill": "deciderPluginName"}
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)
    prefill_required: ClassVar[bool] = False

    class Params(PluginParams):
        threshold: int | None = Field(None, ge=0)
        hash_block_size: int | None = Field(None, alias="hashBlockSize", ge=1)
        prefix_plugin_name: str | None = Field(None, alias="prefixPluginName")
        prefix_plugin_type: str | None = Field(None, alias="prefixPluginType")
        primary_port: int = Field(0, alias="primaryPort", ge=0, le=65535)
        decode_profile: str = Field("decode", alias="decodeProfile", min_length=1)
        prefill_profile: str = Field("prefill", alias="prefillProfile", min_length=1)
        decider_plugin_name: str | None = Field(None, alias="deciderPluginName")
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")

        @model_validator(mode="after")
        def _one_rule(self) -> PdProfileHandler.Params:
            if self.decider_plugin_name and self.threshold is not None:
                raise ValueError("threshold (v0.3 rule) and deciderPluginName cannot both be set")
            return self

    params: Params  # narrows the base handler's attribute to this model

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._configure(DisaggStages(params.decode_profile, params.prefill_profile, "encode",
                                     params.decider_plugin_name, None))

    def check_profiles(self, profiles: Mapping[str, Profile]) -> None:
        """Config-time check: both the decode and the prefill profile exist."""
        super().check_profiles(profiles)
        if self.prefill_profile not in profiles:
            raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}) needs a scheduling profile named "
                              f"'{self.prefill_profile}' (the prefill profile)", plugin=self.name,
                              field="prefillProfile")

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """``hashBlockSize`` when set, so an auto-created producer hashes in the same blocks."""
        size = params.get("hashBlockSize") if isinstance(params, dict) else params.hash_block_size
        return {"hashBlockSize": size} if size is not None else {}

    def bind(self, handle: Handle) -> None:
        """Resolve the decider plugin (named, or the default one), else build the v0.3.0 threshold rule; a
        ``prefixMatchInfoProducerName`` must name a configured producer either way."""
        named = self.params.prefix_match_info_producer_name
        decider = self._decider_name(handle)
        if decider is not None:
            if named:
                find_prefix_producer(self, handle, producer_name=named)
            self._decider_names["prefill"] = decider
            super().bind(handle)
            return
        via = self.params.prefix_plugin_name
        if not via and self.params.prefix_plugin_type:
            typed = handle.first_of_type(self.params.prefix_plugin_type)
            via = typed.name if typed is not None else None
        producer = find_prefix_producer(self, handle, via=via, producer_name=named)
        size = self.params.hash_block_size
        fixed = getattr(producer, "fixed_block_chars", size)  # None: auto-tuned; absent: not an approximate producer
        if size is not None and fixed != size:
            raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}): hashBlockSize {size} differs from the "
                              f"block size of {PRODUCER_TYPE} '{producer.name}' "
                              f"({fixed or 'auto-tuned'} characters); set hashBlockSize on both",
                              plugin=self.name, field="hashBlockSize")
        self.prefill_decider = _ThresholdDecider(self.name, self.params.threshold or 0, producer.state_key)

    def process_results(self, cycle: CycleState, request: InferenceRequest,
                        results: Mapping[str, ProfileRunResult | None]) -> SchedulingResult:
        """Decode is primary; with ``primaryPort``, decode goes through the pod's primary port (llm-d HEAD)."""
        result = super().process_results(cycle, request, results)
        if self.params.primary_port:
            route_to_primary_port(result, self.decode_profile, self.params.primary_port)
        return result

    def _decider_name(self, handle: Handle) -> str | None:
        """``deciderPluginName``; else the default decider when declared and no v0.3 ``threshold`` is set."""
        if self.params.decider_plugin_name:
            return self.params.decider_plugin_name
        if self.params.threshold is None and handle.plugin(DEFAULT_DECIDER) is not None:
            return DEFAULT_DECIDER
        return None


_check: type[ProfileHandler] = PdProfileHandler
