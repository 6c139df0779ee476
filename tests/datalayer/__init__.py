"""Endpoint discovery, scraping, Kubernetes sources and leader election against real local servers."""
