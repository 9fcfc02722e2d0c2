"""What the engine needs of a drafter and of a draft-size controller, for its requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lookup.draft import Draft


class DraftSource(Protocol):
    """What a request needs from a drafter (``lookup.drafter.Drafter`` or a test's own)."""

    def extend(self, tokens: Sequence[int]) -> None: ...

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft: ...


class DraftPolicy(Protocol):
    """What a request needs from a controller (``lookup.controller.DraftController``)."""

    def budget(self) -> tuple[int, int]: ...

    def observe(self, drafted: int, accepted: int) -> None: ...
