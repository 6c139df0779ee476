"""``decode-filter`` (llm-d): keeps endpoints that can decode, judged by the ``llm-d.ai/role`` label.

Roles kept (llm-d HEAD ``bylabel/roles.go``): ``decode``, ``prefill-decode``, ``both``, ``encode-prefill-decode``,
**and endpoints without the label** (a pool without roles is all-decode). llm-d v0.3.0 kept ``decode|both`` and
unlabeled; those values keep their meaning. No parameters.

YAML::

    - type: decode-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import Filter

from .by_label import RoleFilter

__all__ = ["DecodeFilter", "DECODE_ROLES"]

DECODE_ROLES = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"})


class DecodeFilter(RoleFilter):
    """Endpoints whose role can decode, plus unlabeled ones."""

    type_name: ClassVar[str] = "decode-filter"
    roles = DECODE_ROLES
    allows_no_label = True


_check: type[Filter] = DecodeFilter
