"""The readmission probe: one tiny inference request sent straight to an ejected endpoint.

A wedged model server still answers ``/health`` and ``/metrics``, so only an inference request proves it is back.
:func:`probe_body` shapes the request for the probe path (a completion of one token, or a chat completion of one
token); :class:`Prober` sends it over its own aiohttp session with a timeout and says whether the endpoint
answered: any status below 500 except 429 (a 4xx is the probe's own fault, not the server's; a 429 proves
nothing: the server is too busy to show it works).
"""

from __future__ import annotations

import itertools
import logging
import ssl

import aiohttp
import orjson

from epp.framework.endpoint import Endpoint

__all__ = ["Prober", "probe_body", "probe_passed"]

log = logging.getLogger("epp.plugins.health")

_PROMPT = "ping"


def probe_body(path: str, model: str) -> bytes:
    """The probe's JSON body for ``path``: chat messages for a chat path, else a prompt; one output token."""
    if path.rstrip("/").endswith("chat/completions"):
        return orjson.dumps({"model": model, "messages": [{"role": "user", "content": _PROMPT}], "max_tokens": 1})
    return orjson.dumps({"model": model, "prompt": _PROMPT, "max_tokens": 1})


def probe_passed(status: int) -> bool:
    """Whether a probe answered with ``status`` shows the endpoint serves again."""
    return status < 500 and status != 429


class Prober:
    """Sends probes (``POST path``) with a total ``timeout`` each; :meth:`close` releases the session."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._ids = itertools.count()
        # A probe only asks whether the server answers: an https endpoint's certificate is not checked, as the
        # data layer's sources do by default (insecureSkipVerify).
        self._ssl = ssl.create_default_context()
        self._ssl.check_hostname = False
        self._ssl.verify_mode = ssl.CERT_NONE

    async def probe(self, endpoint: Endpoint, model: str) -> bool:
        """True when ``endpoint`` answered the probe for ``model`` in time (see the module docstring)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout),
                                                  cookie_jar=aiohttp.DummyCookieJar())
        url = f"{endpoint.spec.scheme}://{endpoint.hostport}{self.path}"
        headers = {"Content-Type": "application/json", "x-request-id": f"epp-probe-{next(self._ids)}"}
        try:
            async with self._session.post(url, data=probe_body(self.path, model), headers=headers,
                                          ssl=self._ssl if endpoint.spec.scheme == "https" else True) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("probe of %s failed: %s", endpoint.hostport, type(exc).__name__)
            return False
        if not probe_passed(status):
            log.info("probe of %s answered %d", endpoint.hostport, status)
            return False
        return True

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
