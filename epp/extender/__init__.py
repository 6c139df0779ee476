"""The kube-scheduler extender: ``epp serve --scheduler-extender-port N`` places pods by EPP's live view of its pool.

:mod:`~epp.extender.placement` is the policy (pure: pod, candidate nodes and endpoints in, decisions out),
:mod:`~epp.extender.api` the ``k8s.io/kube-scheduler/extender/v1`` JSON, :mod:`~epp.extender.server` the HTTP
service (``POST /filter``, ``POST /prioritize``). docs/extender.md has the API, the policy and the scheduler's
configuration.
"""

from epp.extender.placement import NodePlacer
from epp.extender.server import ExtenderServer, make_extender_app

__all__ = ["NodePlacer", "ExtenderServer", "make_extender_app"]
