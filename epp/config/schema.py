"""The ``EndpointPickerConfig`` document's schema: pydantic models with ``extra="forbid"``, one per reference type.

Field names are the reference's JSON names (llm-d-router ``apix/config/v1alpha1`` and ``v1``, read with one
model: v1 only moved and removed fields). Models here only describe shape; what a field means, and which values
EPP cannot serve, is decided when the config is built (:mod:`epp.config.loader`, :mod:`epp.config.wiring`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ApiVersion", "API_VERSIONS", "PluginSpec", "ProfilePluginRef", "ProfileSpec", "PluginRef",
           "DataSourceSpec", "DiscoverySpec", "CrossReplicaSpec", "DataLayerSpec", "RequestHandlerSpec",
           "EndpointPickerConfig"]

ApiVersion = Literal["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1", "llm-d.ai/v1"]
API_VERSIONS: tuple[str, ...] = get_args(ApiVersion)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PluginSpec(_Strict):
    type: str = ""  # required, but checked by the builder so that the error names the plugin
    name: str | None = None
    parameters: dict[str, Any] | None = None


class ProfilePluginRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    weight: float | None = None


class ProfileSpec(_Strict):
    name: str = ""  # required, but checked by the builder (missing and empty read alike, as in the reference)
    plugins: list[ProfilePluginRef] = Field(default_factory=list)


class PluginRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")


class DataSourceSpec(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    extractors: list[PluginRef] = Field(default_factory=list)


class DiscoverySpec(_Strict):
    """``dataLayer.discovery``: v1alpha1's ``{pluginRef}``, or v1's ``{endpoints: {pluginRef}, peers: {pluginRef}}``
    (both shapes are read; giving ``pluginRef`` and ``endpoints`` together is an error of the builder's)."""

    plugin_ref: str | None = Field(None, alias="pluginRef")
    endpoints: PluginRef | None = None
    peers: PluginRef | None = None


class CrossReplicaSpec(_Strict):
    """v1's ``dataLayer.crossReplica`` (EPP has no cross-replica state sync: any setting is refused)."""

    syncer_plugin_ref: str = Field("", alias="syncerPluginRef")
    sync_interval: str | None = Field(None, alias="syncInterval")
    publish_timeout: str | None = Field(None, alias="publishTimeout")


class DataLayerSpec(_Strict):
    inject_defaults: bool | None = Field(None, alias="injectDefaults")
    """False: no default data source is added (the reference's ``injectDefaults``; omitted means true)."""
    sources: list[DataSourceSpec] = Field(default_factory=list)
    discovery: DiscoverySpec | None = None
    # v1alpha1's peer and cross-replica fields (v1 moved them under discovery.peers and crossReplica).
    peer_discovery: PluginRef | None = Field(None, alias="peerDiscovery")
    cross_replica_syncer_plugin_ref: str = Field("", alias="crossReplicaSyncerPluginRef")
    cross_replica_sync_interval: str | None = Field(None, alias="crossReplicaSyncInterval")
    cross_replica: CrossReplicaSpec | None = Field(None, alias="crossReplica")


class RequestHandlerSpec(_Strict):
    parsers: list[PluginRef] = Field(default_factory=list)
    """The parsers, each request read by the one whose claimed path suffix it matches (see
    :mod:`epp.scheduling.parsers`); empty: the deprecated top-level ``parser``, else the default."""
    propagate_priority: bool = Field(False, alias="propagatePriority")


class EndpointPickerConfig(_Strict):
    """The whole YAML document, as the reference's ``EndpointPickerConfig`` type defines it."""

    api_version: ApiVersion = Field("inference.networking.x-k8s.io/v1alpha1", alias="apiVersion")
    kind: Literal["EndpointPickerConfig"] = "EndpointPickerConfig"
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[ProfileSpec] = Field(default_factory=list, alias="schedulingProfiles")
    saturation_detector: PluginRef | None = Field(None, alias="saturationDetector")
    parser: PluginRef | None = None
    data_layer: DataLayerSpec | None = Field(None, alias="dataLayer")
    flow_control: dict[str, Any] | None = Field(None, alias="flowControl")
    request_handler: RequestHandlerSpec | None = Field(None, alias="requestHandler")
