"""Hosted and self-hosted HTTP upstreams: the request relayed as it came."""
