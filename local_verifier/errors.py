"""Errors raised by local_verifier."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what is supported or how to install it."""


class PromptTooLong(ValueError):
    """The prompt leaves no room to generate within the model's context."""

    def __init__(self, prompt_tokens: int, context_length: int) -> None:
        super().__init__(
            f"prompt has {prompt_tokens} tokens; the model's context is {context_length} tokens "
            "and at least one must be left to generate"
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


class PredictionTooLong(ValueError):
    """The prediction has more tokens than the model's context could ever generate."""

    def __init__(self, context_length: int) -> None:
        super().__init__(f"prediction is longer than the model's context ({context_length} tokens)")


class EngineBusy(RuntimeError):
    """The engine's queue is full; the request may be retried later."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} requests are waiting for the local engine; try again")
        self.waiting = waiting


class TenantBusy(EngineBusy):
    """One tenant's requests fill its share of the engine's places; others may still run."""

    def __init__(self, owned: int, places: int) -> None:
        RuntimeError.__init__(
            self, f"{owned} of this tenant's requests are running or waiting (at most {places})"
        )
        self.waiting = owned
        self.places = places


class EngineClosed(RuntimeError):
    """The engine was closed (``Engine.close`` or interpreter exit); it takes no requests."""
