"""HTTP plumbing: pure-ASGI helpers for the hot path and server-sent events."""
