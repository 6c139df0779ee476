"""The KV-cache event index and its subscribers."""
