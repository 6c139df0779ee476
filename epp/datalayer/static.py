"""Static discovery: endpoints from a YAML file, reloaded when it changes.

File shape (``epp serve --endpoints FILE``)::

    endpoints:
      - name: pod-a
        namespace: llm                    # optional, as the reference's file discovery (kept on the endpoint)
        address: 127.0.0.1
        port: 8000
        labels: {llm-d.ai/role: decode}   # optional
        metricsHost: 10.0.0.5:9090        # optional, as the reference: host:port the metrics page is scraped from
        metricsPort: 8000                 # optional (EPP), default: port; the same host, another port
        metricsPath: /metrics             # optional
        engine: vllm                      # optional: vllm | sglang | trtllm-serve | any configured engine
        scheme: http                      # optional: https for a TLS-only server (requests and metrics)
        node: gpu-node-1                  # optional (EPP): the Kubernetes node it runs on, for the scheduler extender
    inferenceObjectives:                  # optional: what the x-llm-d-router-inference-objective header names
      - name: interactive
        priority: 10                      # optional, default 0
    inferenceModelRewrites:               # optional: the InferenceModelRewrite spec, without poolRef
      - name: canary
        rules:
          - matches: [{model: {value: llama}}]          # no matches: every model
            targets: [{modelRewrite: llama-v2, weight: 90}, {modelRewrite: llama-v3, weight: 10}]

Unknown keys are errors; names and ``address:port`` must be unique. The file is polled (content compared by hash);
a valid new version is applied whole through :meth:`Datastore.replace_all` (unchanged endpoints keep their
identity and in-flight counters); an invalid one is logged and the previous version stays. At start, an invalid
file is a :class:`~epp.errors.ConfigError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec
from epp.framework.objectives import ModelRewrite, RewriteRule, RewriteTarget
from epp.framework.pool import EndpointStore

__all__ = ["StaticFileDiscovery", "EndpointsDocument", "load_endpoints_file", "parse_endpoints",
           "parse_endpoints_document"]

log = logging.getLogger(__name__)


class _EndpointEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1)
    namespace: str = ""
    address: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    labels: dict[str, str] = Field(default_factory=dict)
    metrics_host: str | None = Field(None, alias="metricsHost", min_length=1)
    metrics_port: int | None = Field(None, alias="metricsPort", ge=1, le=65535)
    metrics_path: str = Field("/metrics", alias="metricsPath")
    engine: str | None = Field(None, min_length=1)
    scheme: str = Field("http", pattern="^https?$")
    node: str = ""

    @field_validator("labels", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        # YAML turns `tier: 1` into an int; label values are strings in Kubernetes and in the reference.
        if isinstance(v, dict):
            return {str(k): ("" if val is None else str(val)) for k, val in v.items()}
        return v

    @field_validator("metrics_host")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is not None:
            _split_host_port(v)  # raises ValueError saying what is wrong
        return v

    @field_validator("metrics_path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must start with '/'")
        return v


def _split_host_port(value: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts bracketed, ``[::1]:9090``) -> ``(host, port)``; ``ValueError`` otherwise."""
    try:
        parts = urlsplit("//" + value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"must be host:port, not {value!r} ({exc})") from exc
    if not parts.hostname or port is None or not 1 <= port <= 65535 or parts.username is not None \
            or parts.password is not None or parts.path or parts.query or parts.fragment:
        raise ValueError(f"must be host:port with a port in 1-65535, not {value!r}")
    return parts.hostname, port


class _ObjectiveEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    priority: StrictInt | None = None


class _ModelMatchEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["Exact"] = "Exact"
    value: str = Field(min_length=1)


class _MatchEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: _ModelMatchEntry


class _TargetEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model_rewrite: str = Field(alias="modelRewrite", min_length=1)
    weight: StrictInt | None = Field(None, ge=1, le=1_000_000)


class _RuleEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    matches: list[_MatchEntry] = Field(default_factory=list)
    targets: list[_TargetEntry] = Field(min_length=1)


class _RewriteEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    rules: list[_RuleEntry] = Field(min_length=1)


class _EndpointsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoints: list[_EndpointEntry] = Field(default_factory=list)
    objectives: list[_ObjectiveEntry] = Field(default_factory=list, alias="inferenceObjectives")
    rewrites: list[_RewriteEntry] = Field(default_factory=list, alias="inferenceModelRewrites")


@dataclass
class EndpointsDocument:
    """Everything an endpoints file declares: endpoints, objective priorities (None = unset) and rewrites."""

    endpoints: list[EndpointSpec] = field(default_factory=list)
    objectives: dict[str, int | None] = field(default_factory=dict)
    rewrites: list[ModelRewrite] = field(default_factory=list)


def parse_endpoints(text: str, source: str = "<endpoints>") -> list[EndpointSpec]:
    """The endpoints of an endpoints document (see :func:`parse_endpoints_document`)."""
    return parse_endpoints_document(text, source).endpoints


def parse_endpoints_document(text: str, source: str = "<endpoints>") -> EndpointsDocument:
    """Parse and validate an endpoints document; ``ConfigError`` naming the entry and field on any problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise ConfigError(f"invalid YAML: {exc}", source=source, line=None if line is None else line + 1) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("endpoints file must be a mapping with an 'endpoints' list", source=source)
    try:
        doc = _EndpointsFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise ConfigError(f"{where}: {err.get('msg', 'invalid')}", field=where, source=source) from exc
    return EndpointsDocument(_endpoint_specs(doc, source), _objectives(doc, source), _rewrites(doc, source))


def _objectives(doc: _EndpointsFile, source: str) -> dict[str, int | None]:
    objectives: dict[str, int | None] = {}
    for i, o in enumerate(doc.objectives):
        if o.name in objectives:
            raise ConfigError(f"inferenceObjectives.{i}.name: duplicate objective '{o.name}'", field="name",
                              source=source)
        objectives[o.name] = o.priority
    return objectives


def _rewrites(doc: _EndpointsFile, source: str) -> list[ModelRewrite]:
    rewrites: list[ModelRewrite] = []
    names: set[str] = set()
    for i, r in enumerate(doc.rewrites):
        if r.name in names:
            raise ConfigError(f"inferenceModelRewrites.{i}.name: duplicate rewrite '{r.name}'", field="name",
                              source=source)
        names.add(r.name)
        rules = tuple(RewriteRule(frozenset(m.model.value for m in rule.matches),
                                  tuple(RewriteTarget(t.model_rewrite, t.weight) for t in rule.targets))
                      for rule in r.rules)
        rewrites.append(ModelRewrite(r.name, float(i), rules))  # file order stands for creation order
    return rewrites


def _endpoint_specs(doc: _EndpointsFile, source: str) -> list[EndpointSpec]:
    specs: list[EndpointSpec] = []
    names: dict[str, str] = {}
    hostports: dict[str, str] = {}
    for i, e in enumerate(doc.endpoints):
        if e.name in names:
            # The reference keys file entries by namespace/name; EPP keys every endpoint by name alone.
            why = "" if names[e.name] == e.namespace else " (EPP needs names unique across namespaces)"
            raise ConfigError(f"endpoints.{i}.name: duplicate endpoint name '{e.name}'{why}", field="name",
                              source=source)
        names[e.name] = e.namespace
        metrics_address, metrics_port = _metrics_location(e, i, source)
        spec = EndpointSpec(name=e.name, address=e.address, port=e.port, labels=e.labels,
                            metrics_port=metrics_port, metrics_path=e.metrics_path, engine=e.engine,
                            scheme=e.scheme, namespace=e.namespace, metrics_address=metrics_address,
                            node=e.node)
        other = hostports.setdefault(spec.hostport, e.name)
        if other != e.name:
            raise ConfigError(f"endpoints.{i}: '{e.name}' and '{other}' are both {spec.hostport}", field="port",
                              source=source)
        specs.append(spec)
    return specs


def _metrics_location(e: _EndpointEntry, i: int, source: str) -> tuple[str | None, int | None]:
    """``(metrics_address, metrics_port)`` of an entry: from ``metricsHost``, else ``metricsPort`` (or neither)."""
    if e.metrics_host is None:
        return None, e.metrics_port
    if e.metrics_port is not None:
        raise ConfigError(f"endpoints.{i}: '{e.name}' sets both metricsHost and metricsPort (metricsHost already "
                          f"names the port)", field="metricsHost", source=source)
    return _split_host_port(e.metrics_host)


def load_endpoints_file(path: str | os.PathLike[str]) -> list[EndpointSpec]:
    """Read and parse an endpoints file (``ConfigError`` if unreadable or invalid)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read endpoints file: {exc.strerror}", source=str(p)) from exc
    return parse_endpoints(text, str(p))


class StaticFileDiscovery:
    """Keeps an endpoint store (the Datastore) equal to the endpoints of a YAML file (see the module docstring).

    ``await start()`` loads the file (``ConfigError`` if invalid), fills the datastore, marks it synced and
    starts polling (unless ``watch`` is False: then the file is read once, as the reference's ``file-discovery``
    reads it without ``watchFile``); ``await stop()`` stops polling. ``reload()`` checks the file once (used by
    the poller and by tests); it returns True if a new endpoint set was applied.
    """

    def __init__(self, path: str | os.PathLike[str], datastore: EndpointStore, *, poll_interval: float = 1.0,
                 watch: bool = True) -> None:
        self.path = Path(path)
        self.datastore = datastore
        self.poll_interval = poll_interval
        self.watch = watch
        self.last_error: str | None = None
        self._digest: bytes | None = None
        self._stat: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the file into the datastore (``ConfigError`` if invalid), mark it synced, start polling."""
        data, stat = self._read()
        document = parse_endpoints_document(data.decode("utf-8", "replace"), str(self.path))
        self._apply(document, data, stat)
        self.datastore.mark_synced()
        if self.watch and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll(), name=f"endpoints-file:{self.path}")

    async def stop(self) -> None:
        """Stop polling (the datastore keeps its endpoints)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def reload(self) -> bool:
        """Re-read the file if it changed; apply it if valid, else log the error and keep the previous set."""
        try:
            stat = self._stat_key()
            if stat == self._stat:
                return False
            data, stat = self._read()
        except ConfigError as exc:
            self._reject(str(exc))
            return False
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:  # touched, or reverted to the set already in force
            self._stat = stat
            if self.last_error is not None:
                log.info("endpoints file %s is valid again (unchanged set)", self.path)
                self.last_error = None
            return False
        try:
            document = parse_endpoints_document(data.decode("utf-8", "replace"), str(self.path))
        except ConfigError as exc:
            self._stat = stat  # do not re-parse the same broken content every poll
            self._reject(str(exc))
            return False
        self._apply(document, data, stat)
        log.info("endpoints file %s reloaded: %d endpoints, %d objectives, %d model rewrites", self.path,
                 len(document.endpoints), len(document.objectives), len(document.rewrites))
        return True

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                self.reload()
            except Exception:  # noqa: BLE001 -- the poller must survive anything (e.g. a listener bug)
                log.exception("endpoints file %s: reload failed", self.path)

    def _apply(self, document: EndpointsDocument, data: bytes, stat: tuple[int, int, int]) -> None:
        self.datastore.replace_all(document.endpoints)
        self.datastore.objectives.replace_all(document.objectives)
        self.datastore.rewrites.replace_all(document.rewrites)
        self._digest = hashlib.sha256(data).digest()
        self._stat = stat
        if self.last_error is not None:
            log.info("endpoints file %s is valid again", self.path)
        self.last_error = None

    def _reject(self, message: str) -> None:
        if message != self.last_error:
            log.error("endpoints file rejected, keeping the previous %d endpoints: %s",
                      len(self.datastore.endpoints()), message)
        self.last_error = message

    def _stat_key(self) -> tuple[int, int, int]:
        try:
            st = self.path.stat()
        except OSError as exc:
            raise ConfigError(f"cannot read endpoints file: {exc.strerror}", source=str(self.path)) from exc
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _read(self) -> tuple[bytes, tuple[int, int, int]]:
        stat = self._stat_key()
        try:
            return self.path.read_bytes(), stat
        except OSError as exc:
            raise ConfigError(f"cannot read endpoints file: {exc.strerror}", source=str(self.path)) from exc
