"""Several parsers, one chosen per request by its path: the reference's ``requestHandler.parsers``.

A parser claims path suffixes (its ``claims``). For each request the parser whose claimed suffix the request path
ends with is chosen; the longest suffix wins, then the parser listed first. A parser that claims nothing
(``passthrough-parser``) is the fallback for paths no other parser claims. A path no parser claims, with no
fallback, is a 400. The query string is ignored; an empty path falls back to the ``x-original-path`` and
``x-forwarded-path`` headers. The config builder uses a :class:`ParserRegistry` only for two or more parsers: one
parser reads every request, whatever its path.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Mapping, Sequence

from epp.errors import BadRequest
from epp.framework.request import InferenceRequest

__all__ = ["ParserRegistry", "claims_of", "normalized_path"]

log = logging.getLogger(__name__)


def claims_of(parser: Any) -> tuple[str, ...]:
    """The path suffixes ``parser`` claims, without surrounding slashes (a parser without ``claims`` claims
    nothing, so it is a fallback)."""
    return tuple(c.strip().strip("/") for c in getattr(parser, "claims", ()) if c.strip().strip("/"))


def normalized_path(path: str, headers: Mapping[str, str]) -> str:
    """The request path a parser is chosen by: ``path`` (else the ``x-original-path`` or ``x-forwarded-path``
    header) without its query string and one trailing ``/``."""
    path = path or headers.get("x-original-path") or headers.get("x-forwarded-path") or ""
    return path.split("?", 1)[0].strip().removesuffix("/")


class ParserRegistry:
    """Picks a parser per request (see the module docstring) and parses with it; ``parse`` has the parser plugin
    signature, so the Director calls it as it calls a single parser."""

    type_name: ClassVar[str] = "parser-registry"

    def __init__(self, parsers: Sequence[Any], name: str = "requestHandler.parsers") -> None:
        self.name = name
        self.parsers: tuple[Any, ...] = _usable(parsers)
        """The parsers in configured order, without dropped duplicates and those after the fallback."""
        self.fallback: Any = next((p for p in self.parsers if not claims_of(p)), None)
        ranked = [(-len(suffix), order, suffix, p) for order, p in enumerate(self.parsers) for suffix in claims_of(p)]
        self._claims: tuple[tuple[str, Any], ...] = tuple((suffix, p) for _, _, suffix, p in sorted(
            ranked, key=lambda r: (r[0], r[1])))

    def resolve(self, path: str, headers: Mapping[str, str]) -> Any:
        """The parser for a request to ``path``; ``BadRequest`` when no parser claims it and there is no
        fallback."""
        route = normalized_path(path, headers)
        for suffix, parser in self._claims:  # longest suffix first, then configured order
            if route.endswith(suffix):
                return parser
        if self.fallback is not None:
            return self.fallback
        raise BadRequest(f"no parser registered matching path suffix for: {path or route}")

    def parse(self, path: str, body: bytes, headers: dict[str, str]) -> InferenceRequest:
        """Parse with the parser :meth:`resolve` picks (its errors, or the resolution's 400)."""
        request: InferenceRequest = self.resolve(path, headers).parse(path, body, headers)
        return request

    def usage_reader(self, request: InferenceRequest, sse: bool) -> Any:
        """The usage reader of the parser that read ``request`` (chosen again by its ``:path`` header, which the
        ext_proc front end keeps with the request), or None when that parser has none (the front end's own)."""
        try:
            parser = self.resolve(request.headers.get(":path", ""), request.headers)
        except BadRequest:
            return None
        reader = getattr(parser, "usage_reader", None)
        return reader(request, sse) if reader is not None else None


def _usable(parsers: Sequence[Any]) -> tuple[Any, ...]:
    """``parsers`` without a second parser of a type already listed and without those after the first fallback,
    each dropped one logged (the reference's registry skips them alike)."""
    kept: list[Any] = []
    types: set[str] = set()
    for i, parser in enumerate(parsers):
        if parser.type_name in types:
            log.warning("requestHandler.parsers: parser '%s' is skipped: a parser of type %s is already listed",
                        parser.name, parser.type_name)
        else:
            types.add(parser.type_name)
            kept.append(parser)
        if not claims_of(parser):
            for skipped in parsers[i + 1:]:
                log.warning("requestHandler.parsers: parser '%s' is skipped: it is listed after the fallback "
                            "parser '%s', which takes every path", skipped.name, parser.name)
            break
    return tuple(kept)
