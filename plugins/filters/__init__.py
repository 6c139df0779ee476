"""Built-in filters plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .by_label import ByLabelFilter
from .decode_filter import DecodeFilter
from .encode_filter import EncodeFilter
from .endpoint_attribute import EndpointAttributeFilter
from .header_based_testing import HeaderBasedTestingFilter
from .kv_capacity import KvCapacityFilter
from .label_selector import LabelSelectorFilter
from .prefill_filter import PrefillFilter
from .prefix_cache_affinity import PrefixCacheAffinityFilter
from .session_affinity import SessionAffinityFilter
from .slo_headroom_tier import SloHeadroomTierFilter
from .utilization import UtilizationFilter

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (LabelSelectorFilter, ("by-label-selector",)),
    (ByLabelFilter, ()),
    (DecodeFilter, ()),
    (PrefillFilter, ()),
    (EncodeFilter, ()),
    (PrefixCacheAffinityFilter, ()),
    (KvCapacityFilter, ()),
    (HeaderBasedTestingFilter, ()),
    (SloHeadroomTierFilter, ()),
    (UtilizationFilter, ()),
    (EndpointAttributeFilter, ()),
    (SessionAffinityFilter, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
