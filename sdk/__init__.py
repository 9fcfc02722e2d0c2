"""draftgate SDK: a client for the draftgate gateway and any OpenAI-compatible endpoint.

``Client`` / ``AsyncClient`` speak the OpenAI wire format (``sdk.wire``) plus draftgate's
documents, endpoint records and audits, and make predicted outputs the default way to
edit code (``edit``, ``edit_file``). Errors are in ``sdk.errors``.
"""

__version__ = "0.1.0"
"""The package version: pyproject.toml reads it from here, the CLI and user agent too."""

from sdk.async_client import AsyncClient  # noqa: E402
from sdk.client import Client  # noqa: E402
from sdk.edits import EditDelta, EditResult, EditTimings, EditUsage  # noqa: E402
from sdk.streaming import AsyncStream, Stream  # noqa: E402

__all__ = [
    "AsyncClient",
    "AsyncStream",
    "Client",
    "EditDelta",
    "EditResult",
    "EditTimings",
    "EditUsage",
    "Stream",
    "__version__",
]
