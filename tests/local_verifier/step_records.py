"""Each decode step's rows as an engine runs them, recorded for tests of its shares."""

from __future__ import annotations

from typing import Any

from local_verifier.engine import Engine
from local_verifier.row_prices import RowPrice

Step = list[tuple[str, int, int]]  # (owner, draft rows, context tokens) per decoding request


def record_steps(engine: Engine) -> list[Step]:
    """Each step with a decode row from now on (filled in as the engine runs)."""
    runner = engine._scheduler.runner
    steps: list[Step] = []
    deliver = runner._deliver

    def recorded(rows: list[Any], seqs: list[Any], logits: list[Any]) -> None:
        decodes = [(r, s) for r, s in zip(rows, seqs, strict=True) if r.draft is not None]
        if decodes:
            steps.append(
                [(r.request.owner, len(r.draft), len(s.context_slots)) for r, s in decodes]
            )
        deliver(rows, seqs, logits)

    runner._deliver = recorded  # type: ignore[method-assign]
    return steps


def owners(step: Step) -> set[str]:
    return {o for o, _, _ in step}


def cost(step: Step, owner: str, price: RowPrice) -> float:
    """The modelled seconds of ``owner``'s decode rows in ``step``."""
    return sum(price.seq(1, c) + k * price.row(c) for o, k, c in step if o == owner)
