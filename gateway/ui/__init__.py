"""The dashboard served at ``/ui`` (server-rendered pages, SVG charts, a small script)."""

from gateway.ui.routes import PATHS, ui_routes

__all__ = ["PATHS", "ui_routes"]
