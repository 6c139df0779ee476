"""EPP's exported metrics: the Prometheus families, the instruments behind them, per-request series, pool gauges, label bounds and the metrics port's auth."""
