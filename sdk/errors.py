"""The SDK's exceptions.

Everything the SDK raises on purpose derives from :class:`DraftgateError`::

    DraftgateError
    ├── APIConnectionError        the request never got an answer (refused, reset, DNS, TLS)
    │   └── APITimeoutError       a connect, write, read or pool timeout
    ├── APIStatusError            the server answered with a 4xx/5xx status
    │   ├── BadRequestError           400
    │   ├── AuthenticationError       401
    │   ├── PermissionDeniedError     403
    │   ├── NotFoundError             404
    │   ├── PayloadTooLargeError      413
    │   ├── UnprocessableEntityError  422
    │   ├── RateLimitError            429
    │   └── InternalServerError       5xx
    ├── APIStreamError            a stream broke: an in-stream error event, or no ``[DONE]``
    ├── APIResponseValidationError  a 2xx body that is not the expected wire type
    └── EditError                 a code edit could not be made or written
        ├── IncompleteEditError       the answer stopped before it was complete
        ├── BinaryFileError           ``edit_file`` refused a binary file
        ├── FileTooLargeError         ``edit_file`` refused a file over the size cap
        └── NotRegularFileError       ``edit_file`` refused a symlink, FIFO or device

Status errors carry the parsed OpenAI-style body (:class:`sdk.wire.ErrorResponse`), the
status code and the response headers.
"""

from __future__ import annotations

import httpx

from sdk.wire import ErrorDetail, ErrorResponse


class DraftgateError(Exception):
    """Base class of every error the SDK raises."""


class APIConnectionError(DraftgateError):
    """The request did not get an HTTP answer."""

    def __init__(self, message: str, *, request: httpx.Request | None = None) -> None:
        super().__init__(message)
        self.request = request


class APITimeoutError(APIConnectionError):
    """A timeout (connect, write, read or waiting for a pooled connection)."""


class APIStatusError(DraftgateError):
    """The server answered with an error status; ``body`` is its OpenAI-style error."""

    def __init__(self, status_code: int, body: ErrorResponse, headers: httpx.Headers) -> None:
        super().__init__(f"{status_code} {body.error.type}: {body.error.message}")
        self.status_code = status_code
        self.body = body
        self.headers = headers

    @property
    def error(self) -> ErrorDetail:
        """The ``error`` object of the body (message, type, code, param)."""
        return self.body.error


class BadRequestError(APIStatusError):
    """400: the request was malformed or named an invalid field."""


class AuthenticationError(APIStatusError):
    """401: missing or unknown API key."""


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this."""


class NotFoundError(APIStatusError):
    """404: unknown model, document or route."""


class PayloadTooLargeError(APIStatusError):
    """413: the request body is over the server's limit."""


class UnprocessableEntityError(APIStatusError):
    """422: the body parsed but was refused."""


class RateLimitError(APIStatusError):
    """429: slow down; ``headers`` may carry ``Retry-After``."""


class InternalServerError(APIStatusError):
    """5xx: the server or its upstream failed."""


class APIStreamError(DraftgateError):
    """A stream broke after it started: an in-stream error event, or it ended early."""

    def __init__(self, message: str, *, body: ErrorResponse | None = None) -> None:
        super().__init__(message)
        self.body = body


class APIResponseValidationError(DraftgateError):
    """A successful response whose body is not the expected wire type."""


class EditError(DraftgateError):
    """A code edit could not be made or written."""


class IncompleteEditError(EditError):
    """The model stopped before the edit was complete (e.g. ``finish_reason == "length"``).

    ``raw`` is the answer received so far; ``completion_tokens`` its size as the endpoint
    reported it (None without usage).
    """

    def __init__(self, message: str, *, raw: str = "", completion_tokens: int | None = None):
        super().__init__(message)
        self.raw = raw
        self.completion_tokens = completion_tokens


class BinaryFileError(EditError):
    """The file looks binary; only text files are edited."""


class FileTooLargeError(EditError):
    """The file is larger than the size cap."""


class NotRegularFileError(EditError):
    """The path is not a regular file (a symbolic link, FIFO, device or directory)."""


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error(status_code: int, body: ErrorResponse, headers: httpx.Headers) -> APIStatusError:
    """The :class:`APIStatusError` subclass for a status code."""
    if status_code >= 500:
        cls: type[APIStatusError] = InternalServerError
    else:
        cls = _STATUS_ERRORS.get(status_code, APIStatusError)
    return cls(status_code, body, headers)
