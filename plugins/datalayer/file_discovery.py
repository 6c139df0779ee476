"""``file-discovery``: endpoints from a YAML (or JSON) file, the endpoint source ``dataLayer.discovery`` names.

The reference's file discovery plugin (llm-d-router ``plugins/datalayer/discovery/file``): with it the EPP needs
no Kubernetes cluster. The file is EPP's endpoints file (:mod:`epp.datalayer.static`), of which the reference's
shape is a subset (``name``, ``namespace``, ``address``, ``port`` as a number or a quoted string,
``metricsHost``, ``labels``). It is read when EPP starts (an invalid file stops the start); with ``watchFile:
true`` it is read again when it changes (polled every second; an invalid version is logged and the previous set
stays in force), else never again. YAML::

    plugins:
    - type: file-discovery
      parameters:
        path: /etc/epp/endpoints.yaml   # required
        watchFile: true                 # default false
    dataLayer:
      discovery:
        pluginRef: file-discovery       # v1alpha1; v1 writes discovery: {endpoints: {pluginRef: file-discovery}}

A discovery plugin replaces the command line's endpoint source (``--endpoints``, ``--pool-name``,
``--endpoint-selector``), as the reference's bypasses its Kubernetes reconcilers.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.datalayer.static import StaticFileDiscovery
from epp.datalayer.datastore import Datastore
from epp.framework.plugins import Handle, Params

__all__ = ["FileDiscovery"]


class FileDiscovery:
    """Endpoint discovery from a file: :meth:`discovery_service` is the service that keeps a datastore equal to
    the file's endpoints (see the module docstring)."""

    type_name: ClassVar[str] = "file-discovery"

    class Params(Params):
        path: str = Field(min_length=1)
        watch_file: bool = Field(False, alias="watchFile")

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params

    def discovery_service(self, datastore: Datastore) -> StaticFileDiscovery:
        """A (not yet started) service filling ``datastore`` from the file: ``await start()`` loads it (a
        ``ConfigError`` if it is invalid), ``await stop()`` stops watching it."""
        return StaticFileDiscovery(self.params.path, datastore, watch=self.params.watch_file)
