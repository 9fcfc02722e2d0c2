"""Exactness measured, not assumed: the verify path's greedy tokens against the engine's
own greedy decoding on canned prompts.

For each prompt the engine decodes ``TOKENS`` tokens greedily (its own streamed decoding);
one scoring round trip then reads its top-1 at every one of those positions, given the
same prefix. ``exact``: every token agrees and the engine's ``/tokenize`` gives the
gateway tokenizer's ids for a sample text; ``approximate``: tokenizers agree but some
tokens do not (the agreement rate says how many did); ``failed``: the tokenizers disagree
or the engine could not be asked. The timings feed the endpoint's :class:`Pacing`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gateway.endpoints.remote.verify import Pacing
from gateway.endpoints.remote.wire import EngineClient

if TYPE_CHECKING:
    from local_verifier.tokenizer import Tokenizer

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
)
TOKENS = 16
TOKENIZER_SAMPLE = "Draftgate checks tokenizers: café, naïve, 日本語, 12345 and `code()`."
State = Literal["exact", "approximate", "failed"]


@dataclass(frozen=True)
class SelfTest:
    """One self-test's outcome."""

    state: State
    agreement: float  # agreeing greedy tokens / compared
    compared: int
    tokenizer_agrees: bool
    detail: str
    round_trip_s: float = 0.0
    token_s: float = 0.0
    at: float = 0.0

    @staticmethod
    def failed(detail: str) -> SelfTest:
        return SelfTest("failed", 0.0, 0, False, f"self-test failed: {detail}", at=time.time())

    def values(self) -> dict[str, float]:
        return {
            "agreement": self.agreement,
            "compared": float(self.compared),
            "tokenizer_agrees": float(self.tokenizer_agrees),
            "round_trip_s": self.round_trip_s,
            "token_s": self.token_s,
        }


async def run_self_test(client: EngineClient, tokenizer: Tokenizer, pacing: Pacing) -> SelfTest:
    """Compare, time and decide (see the module docstring)."""
    agrees = await client.tokenize(TOKENIZER_SAMPLE) == tokenizer.encode(TOKENIZER_SAMPLE)
    compared = matched = 0
    for i, text in enumerate(PROMPTS):
        ids = tokenizer.encode(text, add_special_tokens=True)
        t0 = time.perf_counter()
        greedy = [t async for batch in client.decode(ids, TOKENS) for t in batch]
        decode_s = time.perf_counter() - t0
        if not greedy:
            continue
        scored = await client.score(ids + greedy, len(greedy))
        if i > 0:  # the first prompt warms the engine and the connections up
            pacing.note_decode(decode_s, len(greedy))
            pacing.note_round_trip(scored.seconds)
        compared += len(greedy)
        matched += sum(a == b for a, b in zip(scored.top1, greedy, strict=False))
    if not agrees:
        return SelfTest(
            "failed",
            matched / max(compared, 1),
            compared,
            False,
            "the engine's /tokenize disagrees with the configured tokenizer",
            pacing.round_trip_s,
            pacing.token_s,
            time.time(),
        )
    if compared == 0:
        return SelfTest.failed("the engine decoded nothing")
    rate = matched / compared
    state: State = "exact" if matched == compared else "approximate"
    detail = f"{state}: {matched}/{compared} greedy tokens agree"
    if state == "approximate":
        detail += f" ({rate:.3f})"
    return SelfTest(
        state, rate, compared, True, detail, pacing.round_trip_s, pacing.token_s, time.time()
    )
