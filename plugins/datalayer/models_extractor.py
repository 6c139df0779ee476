"""``models-data-extractor``: store each endpoint's served models (from ``models-data-source``) on the endpoint.

Every successful poll replaces the endpoint's ``attributes[MODELS_ATTRIBUTE_KEY]``
(:data:`epp.datalayer.models.MODELS_ATTRIBUTE_KEY`) with a tuple of :class:`~epp.datalayer.models.ModelData`: the
base model and every LoRA adapter the server lists. A failed poll leaves the previous list; the list goes away with
the endpoint. EPP's gateway answers ``GET /v1/models`` from these lists. No parameters. YAML::

    plugins:
    - type: models-data-source
    - type: models-data-extractor
    dataLayer:
      sources:
      - pluginRef: models-data-source
        extractors: [{pluginRef: models-data-extractor}]
"""

from __future__ import annotations

from typing import ClassVar

from epp.datalayer.models import MODELS_ATTRIBUTE_KEY, ModelsResponse
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Handle, NoParams

__all__ = ["ModelsExtractor"]


class ModelsExtractor:
    """Stores a ``models-data-source`` response on its endpoint (see the module docstring)."""

    type_name: ClassVar[str] = "models-data-extractor"
    source_type: ClassVar[str] = "models-data-source"
    """The type of data source whose responses this extractor takes."""
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params

    def extract(self, endpoint: Endpoint, response: ModelsResponse) -> None:
        """Replace ``endpoint``'s stored models with ``response.data``; ``TypeError`` for any other input (the
        reference's "unexpected input in Extract")."""
        if not isinstance(response, ModelsResponse):
            raise TypeError(f"unexpected input in extract: {type(response).__name__}")
        endpoint.attributes[MODELS_ATTRIBUTE_KEY] = response.data
