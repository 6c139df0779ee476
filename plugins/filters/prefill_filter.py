"""``prefill-filter`` (llm-d): keeps endpoints that can prefill, judged by the ``llm-d.ai/role`` label.

Roles kept (llm-d HEAD ``bylabel/roles.go``): ``prefill``, ``encode-prefill``, ``prefill-decode``, ``both``,
``encode-prefill-decode``. Unlabeled endpoints do not pass. (llm-d v0.3.0 kept ``prefill`` only.) No parameters.

YAML::

    - type: prefill-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import Filter

from .by_label import RoleFilter

__all__ = ["PrefillFilter", "PREFILL_ROLES"]

PREFILL_ROLES = frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"})


class PrefillFilter(RoleFilter):
    """Endpoints whose role can prefill."""

    type_name: ClassVar[str] = "prefill-filter"
    roles = PREFILL_ROLES


_check: type[Filter] = PrefillFilter
