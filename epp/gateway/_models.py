"""``GET /v1/models``: the union of the models and LoRA adapters the pool serves.

Each endpoint's list is the one a ``models-data-extractor`` stored on it (``epp.datalayer.models``), when one is
configured and has polled the endpoint successfully; otherwise the endpoint's own ``/v1/models`` is asked
(concurrently, with a short timeout). The lists are merged by ``id``, first seen wins; adapters the endpoints'
metrics report as running or waiting (``vllm:lora_requests_info``) are added when no endpoint listed them. The
merged list is cached for ``ttl`` seconds and concurrent callers share one refresh, so a burst of ``/v1/models``
calls costs one round of upstream requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import aiohttp
import orjson

from epp.datalayer.datastore import Datastore
from epp.datalayer.models import stored_models
from epp.framework.endpoint import Endpoint

__all__ = ["ModelCatalog"]

log = logging.getLogger("epp.gateway")


class ModelCatalog:
    """Caches the pool's model list; :meth:`models` returns OpenAI ``Model`` objects."""

    def __init__(self, datastore: Datastore, session: Callable[[], aiohttp.ClientSession], *, ttl: float = 5.0,
                 timeout: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.datastore = datastore
        self._session = session
        self.ttl = ttl
        self.timeout = timeout
        self._clock = clock
        self._cached: list[dict[str, Any]] | None = None
        self._expires = 0.0
        self._refresh: asyncio.Future[list[dict[str, Any]]] | None = None

    async def models(self) -> list[dict[str, Any]]:
        """The merged model list (from the cache when it is younger than ``ttl``)."""
        if self._cached is not None and self._clock() < self._expires:
            return self._cached
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(self._load())
            self._refresh.add_done_callback(self._refreshed)
        return await asyncio.shield(self._refresh)

    def _refreshed(self, fut: asyncio.Future[list[dict[str, Any]]]) -> None:
        self._refresh = None
        if not fut.cancelled() and fut.exception() is None:
            self._cached = fut.result()
            self._expires = self._clock() + self.ttl

    async def _load(self) -> list[dict[str, Any]]:
        endpoints = list(self.datastore.endpoints())
        answers = await asyncio.gather(*(self._query(ep) for ep in endpoints))
        merged: dict[str, dict[str, Any]] = {}
        for entries in answers:
            for entry in entries:
                merged.setdefault(entry["id"], entry)
        for ep in endpoints:
            for adapter in sorted(ep.metrics.running_loras | ep.metrics.waiting_loras):
                merged.setdefault(adapter, _adapter_entry(adapter))
        return list(merged.values())

    async def _query(self, ep: Endpoint) -> list[dict[str, Any]]:
        stored = stored_models(ep)
        if stored is not None:  # kept current by the data layer: no need to ask again
            return [model.card() for model in stored if model.id]
        url = f"{ep.spec.scheme}://{ep.hostport}/v1/models"
        try:
            async with self._session().get(url, timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                if resp.status != 200:
                    return []
                data = orjson.loads(await resp.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError) as exc:
            log.debug("model list of %s unavailable: %s", ep.hostport, exc)
            return []
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            return []
        return [item for item in items if isinstance(item, dict) and isinstance(item.get("id"), str)]


def _adapter_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": name,
            "parent": None}
