"""The contracts plugins implement and read: plugin Protocols, endpoints, requests, objectives, and the registry.

Nothing here imports the engine; plugins import only this package, :mod:`epp.errors`, :mod:`epp.headers` and the
documented helper packages.
"""
