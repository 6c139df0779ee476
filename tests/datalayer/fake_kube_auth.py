"""The API server's review endpoints for :class:`~fake_kube.FakeKube`: ``TokenReview``
(``authentication.k8s.io/v1``) and ``SubjectAccessReview`` (``authorization.k8s.io/v1``) for non-resource URLs,
as a real API server answers them (request and response shapes, ``status.authenticated``/``user``,
``status.allowed``/``denied``/``reason``). Tokens and grants are set by the test, standing in for ServiceAccount
tokens and RBAC ClusterRoles with ``nonResourceURLs``. Each review counts in ``fake.requests`` as
``("create", "tokenreviews")`` or ``("create", "subjectaccessreviews")``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .fake_kube import FakeKube


class AuthReviews:
    """Register with ``AuthReviews(fake)`` before ``fake.start()``; then :meth:`add_token` and :meth:`grant`."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.tokens: dict[str, dict[str, Any]] = {}
        self.grants: set[tuple[str, str, str]] = set()
        fake.route_hooks.append(self._routes)

    def add_token(self, token: str, username: str, groups: tuple[str, ...] = ("system:authenticated",)) -> None:
        """Make ``token`` authenticate as ``username`` in ``groups``."""
        self.tokens[token] = {"username": username, "uid": f"uid-{username}", "groups": list(groups)}

    def grant(self, subject: str, path: str, verb: str = "get") -> None:
        """Allow a user name, or ``group:<name>``, to ``verb`` the non-resource URL ``path``."""
        self.grants.add((subject, path, verb))

    def _routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._access_review)

    async def _token_review(self, request: web.Request) -> web.Response:
        self.fake.requests[("create", "tokenreviews")] += 1
        body = await request.json()
        user = self.tokens.get(((body.get("spec") or {}).get("token")) or "")
        status: dict[str, Any] = {"authenticated": True, "user": user} if user else {"error": "invalid bearer token"}
        return web.json_response({**body, "status": status}, status=201)

    async def _access_review(self, request: web.Request) -> web.Response:
        self.fake.requests[("create", "subjectaccessreviews")] += 1
        body = await request.json()
        spec = body.get("spec") or {}
        attrs = spec.get("nonResourceAttributes") or {}
        subjects = [spec.get("user", "")] + [f"group:{g}" for g in spec.get("groups") or []]
        allowed = any((s, attrs.get("path"), attrs.get("verb")) in self.grants for s in subjects)
        status = {"allowed": allowed, "reason": "RBAC: allowed by ClusterRoleBinding" if allowed else ""}
        return web.json_response({**body, "status": status}, status=201)
