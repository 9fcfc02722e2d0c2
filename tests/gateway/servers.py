"""Run an ASGI app in a real uvicorn server on a free loopback port, in a thread."""

from gateway.audit.serve import serve_in_thread as serve

__all__ = ["serve"]
