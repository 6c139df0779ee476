"""EPP's tests, one package per area: a directory's helpers are imported relatively, and ``conftest.py`` holds
what all of them share."""
