"""Built-in profiles plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .always_disagg_decider import AlwaysDisaggPdDecider
from .always_disagg_multimodal_decider import AlwaysDisaggMultimodalDecider
from .data_parallel import DataParallelProfileHandler
from .disagg_headers import DisaggHeadersHandler
from .disagg_profile import DisaggProfileHandler
from .header_profile import HeaderProfileHandler
from .pd_profile import PdProfileHandler
from .prefix_based_decider import PrefixBasedPdDecider
from .single_profile import SingleProfileHandler

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (SingleProfileHandler, ()),
    (DisaggProfileHandler, ()),
    (PdProfileHandler, ()),
    (DataParallelProfileHandler, ()),
    (DisaggHeadersHandler, ("prefill-header-handler",)),
    (PrefixBasedPdDecider, ()),
    (AlwaysDisaggPdDecider, ()),
    (AlwaysDisaggMultimodalDecider, ()),
    (HeaderProfileHandler, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
