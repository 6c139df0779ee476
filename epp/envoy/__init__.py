"""Envoy in front of EPP: the bootstrap ``epp envoy-config`` writes, the EDS server, and running the envoy binary."""
