"""The engine: the Director (one path for a request's life), the Filter -> Score -> Pick scheduler, parser choice."""
