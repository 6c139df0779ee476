"""The served-models attribute: what a model server's ``GET /v1/models`` lists, stored per endpoint.

This is the reference's ``attribute/models`` package. The ``models-data-extractor`` stores a tuple of
:class:`ModelData` (the base model and every LoRA adapter registered with the server, in the server's order) in
``Endpoint.attributes[MODELS_ATTRIBUTE_KEY]``; readers use :func:`stored_models`. An endpoint never polled
successfully has no entry (None), which is not the same as an empty list.

:func:`parse_models` decodes a response body as Go's ``encoding/json`` decodes it into the reference's
``ModelResponse{Object, Data []ModelData}``: unknown fields are ignored, a missing or null ``data`` is an empty
list, and a field of the wrong JSON type is an error (:class:`ModelsParseError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from epp.framework.endpoint import Endpoint

__all__ = ["MODELS_ATTRIBUTE_KEY", "ModelData", "ModelsResponse", "ModelsParseError", "parse_models",
           "stored_models"]

MODELS_ATTRIBUTE_KEY = "/v1/models/models-data-extractor"
"""The attribute key: the data type ``/v1/models`` plus the producer ``models-data-extractor``, as the reference's
``ModelsAttributeKey`` renders it."""


class ModelsParseError(ValueError):
    """A ``/v1/models`` body that is not the OpenAI list object (not JSON, or a field of the wrong type)."""


@dataclass(frozen=True, slots=True)
class ModelData:
    """One model card: ``id``, and what the server reports of ``object``, ``created``, ``owned_by``, ``parent``
    (the base model of a LoRA adapter; "" for a base model), ``max_model_len`` (vLLM's context length) and
    ``shutdown_date`` (OpenAI's deprecation date), the newest reference's ``ModelData`` fields. Empty or 0 means not
    reported."""

    id: str
    object: str = ""
    created: int = 0
    owned_by: str = ""
    parent: str = ""
    max_model_len: int = 0
    shutdown_date: str = ""

    def card(self) -> dict[str, Any]:
        """The OpenAI ``Model`` object for this entry (``object`` defaults to ``"model"``, ``parent`` None when
        unset, ``shutdown_date`` only when reported, as the reference's ``models-responder``), as EPP's gateway
        lists it."""
        card = {"id": self.id, "object": self.object or "model", "created": self.created, "owned_by": self.owned_by,
                "parent": self.parent or None}
        if self.shutdown_date:
            card["shutdown_date"] = self.shutdown_date
        return card


@dataclass(frozen=True, slots=True)
class ModelsResponse:
    """A parsed ``/v1/models`` answer: the list object's ``object`` field and its entries."""

    object: str
    data: tuple[ModelData, ...]


_STRING_FIELDS = ("id", "object", "owned_by", "parent", "shutdown_date")


def parse_models(body: bytes) -> ModelsResponse:
    """``body`` decoded as the reference decodes it (see the module docstring); :class:`ModelsParseError`."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ModelsParseError(f"not JSON: {exc}") from None
    if doc is None:  # Go leaves the struct empty for a literal null
        return ModelsResponse("", ())
    if not isinstance(doc, dict):
        raise ModelsParseError(f"expected a JSON object, got {type(doc).__name__}")
    items = doc.get("data")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ModelsParseError(f"'data' must be a list, got {type(items).__name__}")
    return ModelsResponse(_string(doc, "object", "response"), tuple(_entry(item, i) for i, item in enumerate(items)))


def _entry(item: Any, index: int) -> ModelData:
    if item is None:
        return ModelData("")
    if not isinstance(item, dict):
        raise ModelsParseError(f"data[{index}] must be an object, got {type(item).__name__}")
    where = f"data[{index}]"
    fields = {name: _string(item, name, where) for name in _STRING_FIELDS}
    return ModelData(created=_integer(item, "created", where), max_model_len=_integer(item, "max_model_len", where),
                     **fields)


def _integer(obj: dict[str, Any], name: str, where: str) -> int:
    value = obj.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelsParseError(f"{where}.{name} must be an integer")
    return value


def _string(obj: dict[str, Any], name: str, where: str) -> str:
    value = obj.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ModelsParseError(f"{where}.{name} must be a string, got {type(value).__name__}")
    return value


def stored_models(endpoint: Endpoint) -> tuple[ModelData, ...] | None:
    """The models the ``models-data-extractor`` last stored for ``endpoint``; None before its first successful
    poll (or when no such extractor runs)."""
    return endpoint.attributes.get(MODELS_ATTRIBUTE_KEY)
