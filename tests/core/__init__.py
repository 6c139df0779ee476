"""Contracts, configuration, scheduling and metrics, in process."""
