"""``single-profile-handler`` (the default handler): runs the one scheduling profile, which is the primary.

Semantics (reference): the first call returns every profile, the next returns none; ``process_results`` needs
exactly one result and fails the request (429, ``SchedulingFailed``) when that profile found no endpoint.
``check_profiles`` makes the config loader reject it with any other number of profiles.

YAML::

    - type: single-profile-handler
"""

from __future__ import annotations

from typing import ClassVar, Mapping

from epp.errors import ConfigError, SchedulingFailed
from epp.framework.plugins import (
    CycleState,
    Handle,
    NoParams,
    Params,
    Profile,
    ProfileHandler,
    ProfileRunResult,
    SchedulingResult,
)
from epp.framework.request import InferenceRequest

__all__ = ["SingleProfileHandler"]


class SingleProfileHandler:
    """Runs all profiles once; the single result is the primary one."""

    type_name: ClassVar[str] = "single-profile-handler"
    label: ClassVar[str] = "single profile handler"
    """How the reference's failure message names this handler (subclasses run the same one profile)."""
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params: Params = params  # a subclass keeps its own parameter model here

    def check_profiles(self, profiles: Mapping[str, Profile]) -> None:
        """Config-time check: exactly one scheduling profile."""
        if len(profiles) != 1:
            raise ConfigError(f"profile handler '{self.name}' (type: {self.type_name}) needs exactly one scheduling "
                              f"profile, found {len(profiles)}", plugin=self.name, field="schedulingProfiles")

    def pick_profiles(self, cycle: CycleState, request: InferenceRequest, profiles: Mapping[str, Profile],
                      results: Mapping[str, ProfileRunResult | None]) -> list[str]:
        if len(results) == len(profiles):
            return []
        return list(profiles)

    def process_results(self, cycle: CycleState, request: InferenceRequest,
                        results: Mapping[str, ProfileRunResult | None]) -> SchedulingResult:
        if len(results) != 1:
            raise SchedulingFailed("single profile handler is intended to be used with a single profile, failed "
                                   "to process multiple profiles")
        (name, res), = results.items()
        if res is None or not res.endpoints:
            raise SchedulingFailed(f"failed to run scheduler profile '{name}'")
        return SchedulingResult({name: res}, name)


_check: type[ProfileHandler] = SingleProfileHandler
