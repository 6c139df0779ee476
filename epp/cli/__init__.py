"""The ``epp`` command line: one module per sub-command, the argument types they share, and the reference's flags."""
