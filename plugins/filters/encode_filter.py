"""``encode-filter`` (llm-d): keeps endpoints that run the multimodal encoder, by the ``llm-d.ai/role`` label.

Roles kept (llm-d HEAD ``bylabel/roles.go``): ``encode``, ``encode-prefill``, ``encode-prefill-decode``.
Unlabeled endpoints do not pass. No parameters.

YAML::

    - type: encode-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import Filter

from .by_label import RoleFilter

__all__ = ["EncodeFilter", "ENCODE_ROLES"]

ENCODE_ROLES = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


class EncodeFilter(RoleFilter):
    """Endpoints whose role can encode."""

    type_name: ClassVar[str] = "encode-filter"
    roles = ENCODE_ROLES


_check: type[Filter] = EncodeFilter
