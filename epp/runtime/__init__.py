"""A running EPP: the application that composes everything at start-up, the built-in plugin list, worker processes and the demo."""
