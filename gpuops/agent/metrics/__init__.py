"""The run's series for Prometheus, on the target: read off the run's records (reading), written for
node_exporter's textfile collector and pushed to a Pushgateway by the watchdog (publish, outlets), taken away
after the run ended (expire), and printed for `gpuops metrics` (tool). The format and the families are the
wire's (exposition, metric_table): one renderer for all three ways. Standard library only."""
