"""``header-profile-handler`` (Alpha): runs the one scheduling profile a request header names.

For a caller (a coordinator) that already knows which stage each scheduling call is for (``encode``, ``prefill``,
``decode``) and makes one call per stage: one EPP serves every profile. Per request::

    one profile configured          -> run it, whatever the header says
    header (trimmed) names profile  -> run that profile alone; it is the primary one
    header missing or blank         -> run defaultProfile
    header names no profile         -> run none: the request fails (429, SchedulingFailed)

A profile that found no endpoint fails the request too; the reason is logged, not sent to the client.

YAML::

    - type: header-profile-handler
      parameters:
        headerName: EPP-Profile      # default
        defaultProfile: decode       # default; run when the header is missing or blank
"""

from __future__ import annotations

import logging
from typing import ClassVar, Mapping

from pydantic import Field

from epp.errors import SchedulingFailed
from epp.framework.plugins import CycleState, Handle, Profile, ProfileHandler, ProfileRunResult, SchedulingResult
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["HeaderProfileHandler", "DEFAULT_HEADER", "DEFAULT_PROFILE"]

log = logging.getLogger("epp.plugins.header_profile")

DEFAULT_HEADER = "EPP-Profile"
DEFAULT_PROFILE = "decode"


class HeaderProfileHandler:
    """Runs exactly one profile per request: the only one, the one the header names, or ``defaultProfile``."""

    type_name: ClassVar[str] = "header-profile-handler"

    class Params(PluginParams):
        header_name: str = Field(DEFAULT_HEADER, alias="headerName")
        default_profile: str = Field(DEFAULT_PROFILE, alias="defaultProfile")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self.header = params.header_name.strip().lower() or DEFAULT_HEADER.lower()
        self.default_profile = params.default_profile.strip() or DEFAULT_PROFILE

    def _header_value(self, request: InferenceRequest) -> str:
        return (request.headers.get(self.header) or "").strip()

    def pick_profiles(self, cycle: CycleState, request: InferenceRequest, profiles: Mapping[str, Profile],
                      results: Mapping[str, ProfileRunResult | None]) -> list[str]:
        if results:
            return []
        if len(profiles) == 1:
            return list(profiles)
        value = self._header_value(request)
        chosen = value or self.default_profile
        if chosen in profiles:
            return [chosen]
        if value:
            reason = f"no scheduling profile configured for '{self.header}' header value '{value}'"
        else:
            reason = f"defaultProfile '{self.default_profile}' is not a configured scheduling profile"
        log.info("header profile handler '%s': no scheduling profile selected for request %s: %s", self.name,
                 request.request_id, reason)
        return []

    def process_results(self, cycle: CycleState, request: InferenceRequest,
                        results: Mapping[str, ProfileRunResult | None]) -> SchedulingResult:
        if not results:
            raise SchedulingFailed(f"failed to run any scheduler profile for request {request.request_id}")
        if len(results) > 1:
            raise SchedulingFailed(f"header profile handler is intended to run a single profile per request, got "
                                   f"{len(results)}")
        (name, res), = results.items()
        if res is None or not res.endpoints:
            raise SchedulingFailed(f"failed to run scheduler profile '{name}'")
        return SchedulingResult({name: res}, name)


_check: type[ProfileHandler] = HeaderProfileHandler
