"""EPP's own metrics: Prometheus families, their instruments, request series, pool gauges, label bounds, auth."""
