"""``disagg-profile-handler``: prefill/decode (and encode) disaggregation.

Runs the decode profile first. If it chose an endpoint, the configured deciders are asked in turn with that
endpoint: ``deciders.encode`` (runs the encode profile), then ``deciders.prefill`` (runs the prefill profile); a
stage without a decider or without its profile is skipped. ``process_results`` makes decode the primary profile
(429 when decode found nothing) and names the prefill profile in :attr:`SchedulingResult.prefill_profile`; a
prefill the decider asked for but that found no endpoint also fails the request (429). As a PreRequest hook it
sets ``x-prefiller-host-port`` (and ``x-encoder-hosts-ports``) on the upstream request. :attr:`decisions` counts
the outcomes.

YAML::

    - type: prefix-based-pd-decider
      parameters: {nonCachedTokens: 16}
    - type: disagg-profile-handler
      parameters:
        profiles: {decode: decode, prefill: prefill}
        deciders: {prefill: prefix-based-pd-decider}
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Mapping

from pydantic import Field, model_validator

from epp.errors import ConfigError, SchedulingFailed
from epp.framework.plugins import (
    CycleState,
    Handle,
    Params,
    PdDecider,
    PreRequest,
    Profile,
    ProfileHandler,
    ProfileRunResult,
    SchedulingResult,
)
from epp.framework.request import InferenceRequest

from .disagg_headers import set_disagg_headers

__all__ = ["DisaggProfileHandler", "DisaggStages"]

log = logging.getLogger("epp.plugins.disagg_profile")

_PD_ONLY = ("threshold", "hashBlockSize", "prefixPluginType", "prefixPluginName", "primaryPort")
"""``pd-profile-handler`` parameters that llm-d-router's ``disagg-profile-handler`` decodes laxly and ignores."""


class ProfilesParams(Params):
    decode: str = Field("decode", min_length=1)
    prefill: str = Field("prefill", min_length=1)
    encode: str = Field("encode", min_length=1)


class DecidersParams(Params):
    prefill: str | None = None
    encode: str | None = None


_FLAT = ("decode_profile", "prefill_profile", "encode_profile", "prefill_decider_plugin_name",
         "encode_decider_plugin_name", "decider_plugin_name")


class DisaggParams(Params):
    profiles: ProfilesParams | None = None
    deciders: DecidersParams | None = None
    decode_profile: str | None = Field(None, alias="decodeProfile", min_length=1)
    prefill_profile: str | None = Field(None, alias="prefillProfile", min_length=1)
    encode_profile: str | None = Field(None, alias="encodeProfile", min_length=1)
    prefill_decider_plugin_name: str | None = Field(None, alias="prefillDeciderPluginName")
    encode_decider_plugin_name: str | None = Field(None, alias="encodeDeciderPluginName")
    decider_plugin_name: str | None = Field(None, alias="deciderPluginName")

    @model_validator(mode="before")
    @classmethod
    def _drop_pd_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and (ignored := [k for k in _PD_ONLY if k in data]):
            log.warning("disagg-profile-handler ignores pd-profile-handler parameters %s", ", ".join(ignored))
            data = {k: v for k, v in data.items() if k not in _PD_ONLY}
        return data

    @model_validator(mode="after")
    def _one_form(self) -> DisaggParams:
        flat = [f for f in _FLAT if getattr(self, f) is not None]
        if flat and (self.profiles is not None or self.deciders is not None):
            raise ValueError("cannot mix deprecated flat parameters (decodeProfile, prefillProfile, encodeProfile, "
                             "deciderPluginName, prefillDeciderPluginName, encodeDeciderPluginName) with nested "
                             "parameters (profiles, deciders): use one format or the other")
        return self

    def stages(self) -> DisaggStages:
        """Profile and decider names, from whichever form was used, with defaults filled in."""
        prof = self.profiles or ProfilesParams()
        dec = self.deciders or DecidersParams()
        return DisaggStages(
            decode=self.decode_profile or prof.decode,
            prefill=self.prefill_profile or prof.prefill,
            encode=self.encode_profile or prof.encode,
            prefill_decider=self.prefill_decider_plugin_name or self.decider_plugin_name or dec.prefill,
            encode_decider=self.encode_decider_plugin_name or dec.encode,
        )


class DisaggStages:
    """Resolved stage configuration: profile names and decider plugin names (None = stage off)."""

    __slots__ = ("decode", "prefill", "encode", "prefill_decider", "encode_decider")

    def __init__(self, decode: str, prefill: str, encode: str, prefill_decider: str | None,
                 encode_decider: str | None) -> None:
        self.decode, self.prefill, self.encode = decode, prefill, encode
        self.prefill_decider, self.encode_decider = prefill_decider, encode_decider


class DisaggProfileHandler:
    """Decode first, then encode / prefill when their deciders say so; decode is primary."""

    type_name: ClassVar[str] = "disagg-profile-handler"
    decider_fields: ClassVar[dict[str, str]] = {"prefill": "deciders.prefill", "encode": "deciders.encode"}
    """The parameter naming each stage's decider, for error messages."""
    Params = DisaggParams
    prefill_required: ClassVar[bool] = True
    """Whether a prefill the decider asked for must have found an endpoint (else the request fails)."""

    def __init__(self, name: str, params: DisaggParams, handle: Handle) -> None:
        self.name = name
        self.params: Params = params  # a subclass keeps its own parameter model here
        self._configure(params.stages())

    def _configure(self, stages: DisaggStages) -> None:
        self.decode_profile = stages.decode
        self.prefill_profile = stages.prefill
        self.encode_profile = stages.encode
        self._decider_names = {"prefill": stages.prefill_decider, "encode": stages.encode_decider}
        self.prefill_decider: PdDecider | None = None
        self.encode_decider: PdDecider | None = None
        self.decisions: dict[str, int] = {}
        self._asked = f"{self.type_name}/{self.name}/asked"
        self._wanted = f"{self.type_name}/{self.name}/wanted"
        self._done = f"{self.type_name}/{self.name}/done"

    def bind(self, handle: Handle) -> None:
        """Resolve ``deciders.prefill`` / ``deciders.encode`` to PdDecider plugins."""
        for stage, decider_name in self._decider_names.items():
            if decider_name is None:
                continue
            plugin = handle.plugin(decider_name)
            field = self.decider_fields.get(stage, f"deciders.{stage}")
            if plugin is None:
                raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}): {field} names plugin "
                                  f"'{decider_name}', which is not configured", plugin=self.name, field=field)
            if not isinstance(plugin, PdDecider):
                raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}): {field} plugin "
                                  f"'{decider_name}' (type: {plugin.type_name}) is not a decider",
                                  plugin=self.name, field=field)
            setattr(self, f"{stage}_decider", plugin)

    def check_profiles(self, profiles: Mapping[str, Profile]) -> None:
        """Config-time check: the decode profile exists, and so does each stage's profile that has a decider."""
        if self.decode_profile not in profiles:
            raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}) needs a scheduling profile named "
                              f"'{self.decode_profile}' (the decode profile)", plugin=self.name,
                              field="profiles.decode")
        for stage, profile, decider in (("prefill", self.prefill_profile, self._decider_names["prefill"]),
                                        ("encode", self.encode_profile, self._decider_names["encode"])):
            if decider is not None and profile not in profiles:
                raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}) has a {stage} decider but no "
                                  f"scheduling profile named '{profile}'", plugin=self.name,
                                  field=f"profiles.{stage}")

    def pick_profiles(self, cycle: CycleState, request: InferenceRequest, profiles: Mapping[str, Profile],
                      results: Mapping[str, ProfileRunResult | None]) -> list[str]:
        decode = self.decode_profile
        if decode not in results:
            return [decode] if decode in profiles else []
        res = results[decode]
        if res is None or not res.endpoints:
            return []
        target = res.endpoints[0]
        asked: set[str] = cycle.setdefault(self._asked, set())
        for profile, decider in ((self.encode_profile, self.encode_decider),
                                 (self.prefill_profile, self.prefill_decider)):
            if decider is None or profile not in profiles or profile in results or profile in asked:
                continue
            asked.add(profile)
            if decider.disaggregate(cycle, request, target):
                cycle.setdefault(self._wanted, set()).add(profile)
                return [profile]
        self._record(cycle, results)
        return []

    def _record(self, cycle: CycleState, results: Mapping[str, ProfileRunResult | None]) -> None:
        if cycle.get(self._done):
            return
        cycle[self._done] = True
        used = [stage for stage, profile in (("encode", self.encode_profile), ("prefill", self.prefill_profile))
                if results.get(profile) is not None]
        decision = "_".join(used) + "_decode" if used else "decode_only"
        self.decisions[decision] = self.decisions.get(decision, 0) + 1

    def process_results(self, cycle: CycleState, request: InferenceRequest,
                        results: Mapping[str, ProfileRunResult | None]) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is None or not decode.endpoints:
            raise SchedulingFailed("failed to find available decode workers")
        prefill = results.get(self.prefill_profile)
        if self.prefill_required and (prefill is None or not prefill.endpoints) \
                and self.prefill_profile in cycle.get(self._wanted, ()):
            raise SchedulingFailed(f"prefill profile '{self.prefill_profile}' was required but produced no result")
        out: dict[str, ProfileRunResult | None] = {self.decode_profile: decode}
        prefill_profile = None
        for profile in (self.prefill_profile, self.encode_profile):
            res = results.get(profile)
            if res is not None and res.endpoints:
                out[profile] = res
        if self.prefill_profile in out:
            prefill_profile = self.prefill_profile
        return SchedulingResult(out, self.decode_profile, prefill_profile=prefill_profile)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Set ``x-prefiller-host-port`` / ``x-encoder-hosts-ports`` for the chosen prefill / encode endpoints."""
        set_disagg_headers(result, self.prefill_profile, self.encode_profile)


_check: type[ProfileHandler] = DisaggProfileHandler
_check_pre: type[PreRequest] = DisaggProfileHandler
