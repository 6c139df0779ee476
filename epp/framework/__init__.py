"""The contracts plugins implement and read: plugin Protocols, endpoints, requests, objectives, the pool's data-layer
view (:mod:`epp.framework.pool`) and the registry.

Nothing here imports the engine, the front ends or the plugins; the engine's classes satisfy these Protocols
structurally. Plugins import only this package, :mod:`epp.errors`, :mod:`epp.headers`, the base value modules
:mod:`epp.usage` (token usage) and :mod:`epp.config.units` (durations, quantities), and these helpers:
:mod:`epp.kvcache` (KV-block index and events), :mod:`epp.tokenization` (prompt ids in process),
:mod:`epp.latency` (latency prediction, SLO headers),
:mod:`epp.datalayer.models` and :mod:`epp.datalayer.engines` (served models, engine metric specs),
:mod:`epp.datalayer.scraper`, :mod:`epp.datalayer.polling` and :mod:`epp.datalayer.static` (what data-source and
discovery plugins configure and run), :mod:`epp.flowcontrol.policies` and :mod:`epp.flowcontrol.queues` (flow-control
policy contracts), and :mod:`epp._pb.engines` (model servers' gRPC messages).
"""
