"""The ext_proc service on both transports, with and without a real Envoy."""
