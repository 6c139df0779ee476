"""The benchmark tools' plumbing (run from the checkout, not installed)."""
