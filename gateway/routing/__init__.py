"""Spreading a model's traffic over its endpoints: balancing, prefix affinity, health."""
