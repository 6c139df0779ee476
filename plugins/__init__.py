"""EPP's built-in plugins, one per module, grouped by role.

Each group (sub-package) lists its classes and registers them with ``register(registry)``; the composition root,
:mod:`epp.runtime.builtins`, is the one place that lists the groups. Plugins import only the contracts
(:mod:`epp.framework`), :mod:`epp.errors`, :mod:`epp.headers` and the helper packages :mod:`epp.framework` names.
"""

__all__: list[str] = []
