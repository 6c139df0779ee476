"""The latency predictor and its configuration."""
