"""Prefill/decode request shaping: the NIXL v2 protocol as llm-d's sidecar and vLLM's toy proxy speak it.

1. The prefiller gets the original request with ``kv_transfer_params = {do_remote_decode: true, ...}``,
   ``stream: false``, no ``stream_options``, no ``min_tokens``/``min_completion_tokens``, and every token limit
   set to 1 (``max_tokens`` and ``max_completion_tokens``; ``max_output_tokens`` for the Responses API).
2. A 400–451 answer goes back to the client unchanged; any other failure means decode-only with the original
   body (see :func:`prefill_status_is_final`).
3. The decoder gets the original request plus the prefiller's ``kv_transfer_params`` verbatim; the
   ``cached_tokens`` the client sees are the prefiller's (:class:`PrefillOutcome.cached_tokens`).

As llm-d ``pkg/sidecar/proxy/connector_nixlv2.go`` does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from epp.framework.request import ApiKind

__all__ = ["PREFILL_KV_PARAMS", "prefill_body", "decode_body", "with_model", "PrefillOutcome",
           "parse_prefill_response", "prefill_status_is_final"]

log = logging.getLogger(__name__)

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What the prefiller is told: compute the KV cache and hold it for a remote decoder."""

_TOKEN_LIMITS: dict[ApiKind, tuple[str, ...]] = {
    ApiKind.CHAT_COMPLETIONS: ("max_tokens", "max_completion_tokens"),
    ApiKind.COMPLETIONS: ("max_tokens", "max_completion_tokens"),
    ApiKind.RESPONSES: ("max_output_tokens",),
}
_DROPPED_FOR_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens")


def prefill_body(original: dict[str, Any], api: ApiKind, model: str | None = None) -> bytes:
    """The prefill request body for ``original`` (not mutated); ``model`` overrides the body's model."""
    body = dict(original)
    for key in _DROPPED_FOR_PREFILL:
        body.pop(key, None)
    body["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    body["stream"] = False
    for key in _TOKEN_LIMITS.get(api, ("max_tokens",)):
        body[key] = 1
    if model is not None:
        body["model"] = model
    return orjson.dumps(body)


def decode_body(original: dict[str, Any], kv_transfer_params: Any, model: str | None = None) -> bytes:
    """The decode request body: ``original`` plus the prefiller's ``kv_transfer_params`` (not mutated)."""
    body = dict(original)
    body["kv_transfer_params"] = kv_transfer_params
    if model is not None:
        body["model"] = model
    return orjson.dumps(body)


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    """What a successful prefill hands to the decode step."""

    kv_transfer_params: Any
    cached_tokens: int


def parse_prefill_response(body: bytes) -> PrefillOutcome | None:
    """Read ``kv_transfer_params`` and ``usage.prompt_tokens_details.cached_tokens`` (null → 0) from a 2xx
    prefill answer; None if the body is not a JSON object (then the request goes decode-only)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    if "kv_transfer_params" not in obj:
        log.warning("prefiller response has no 'kv_transfer_params'")
    return PrefillOutcome(obj.get("kv_transfer_params"), _cached_tokens(obj))


def _cached_tokens(obj: dict[str, Any]) -> int:
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def prefill_status_is_final(status: int) -> bool:
    """A prefill answer with this status goes to the client as is (400–451, the client's own fault)."""
    return 400 <= status <= 451


def with_model(original: dict[str, Any], model: str) -> bytes:
    """``original`` with ``model`` rewritten: the only change a request without P/D gets (not mutated)."""
    body = dict(original)
    body["model"] = model
    return orjson.dumps(body)
