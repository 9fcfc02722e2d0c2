"""Speculation records per endpoint: documented table, evidence, probes, store."""
