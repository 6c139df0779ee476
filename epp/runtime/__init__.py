"""A running EPP: the app that composes everything at start-up, the built-in plugin list, worker processes, the demo."""
