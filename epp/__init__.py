"""EPP: an endpoint picker for LLM inference (Envoy ext_proc service and OpenAI-compatible gateway)."""

__version__ = "0.1.0"
