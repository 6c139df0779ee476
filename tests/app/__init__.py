"""The served application end to end: ``epp serve``, reloads, drain, demo and the reference flags."""
