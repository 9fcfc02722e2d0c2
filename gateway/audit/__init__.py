"""Latency audits of an endpoint through the gateway: runner, metrics, quality, report."""
