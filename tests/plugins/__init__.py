"""The Filter/Score/Pick plugins, parsers and profile handlers."""
