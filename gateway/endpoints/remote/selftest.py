"""Exactness measured, not assumed: the verify path's greedy tokens against the engine's
own greedy decoding on canned prompts, through the engine's prefix cache.

Every prompt opens with the same preamble (longer than a cache block: vLLM's CPU blocks
hold 128 tokens), so every prompt after the first is partly served from the cache. For
each prompt the engine decodes ``TOKENS`` tokens greedily (its own streamed decoding);
one scoring round trip then reads its top-1 at every one of those positions, and a second
scores the second half again on the same, now cached, prefix. ``exact``: every token
agrees and the engine's ``/tokenize`` gives the gateway tokenizer's ids for a sample
text; ``approximate``: tokenizers agree but some tokens do not (the agreement rate says
how many did); ``failed``: the tokenizers disagree, the engine answered rows it cannot
have computed (out of the vocabulary, non-finite, ranks out of order) or could not be
asked. The detail names the server's version when it tells it, and what the client
learned about the engine (a prefix cache it does not read). The timings feed the
endpoint's :class:`Pacing`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gateway.endpoints.remote.context import TokenIds
from gateway.endpoints.remote.failures import UnusableAnswer
from gateway.endpoints.remote.verify import Pacing
from gateway.endpoints.remote.wire import Ask, EngineClient

if TYPE_CHECKING:
    from local_verifier.tokenizer import Tokenizer

PREAMBLE = (
    "Draftgate's self-test reads this preamble before each question, so that every "
    "question after the first shares a long prefix with the one before it and the engine "
    "serves part of it from its prefix cache. The text itself does not matter; its length "
    "does: it must span at least one whole cache block.\n"
) * 4
PROMPTS = tuple(
    PREAMBLE + text
    for text in (
        "The capital of France is",
        "def fibonacci(n):\n",
        "Once upon a time, in a small village,",
    )
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
    server = await client.version()
    agrees = await client.tokenize(TOKENIZER_SAMPLE) == tokenizer.encode(TOKENIZER_SAMPLE)
    ask = Ask(tokenizer.vocab_size)
    compared = matched = 0
    try:
        for i, text in enumerate(PROMPTS):
            ids = tokenizer.encode(text, add_special_tokens=True)
            t0 = time.perf_counter()
            greedy = [t async for batch in client.decode(TokenIds(ids), TOKENS, ask) for t in batch]
            decode_s = time.perf_counter() - t0
            if not greedy:
                continue
            half = len(greedy) // 2
            scored = await client.score(TokenIds(ids), greedy, ask)
            again = await client.score(TokenIds(ids + greedy[:half]), greedy[half:], ask)
            if i > 0:  # the first prompt warms the engine and the connections up
                pacing.note_decode(decode_s, len(greedy))
                pacing.note_round_trip(scored.seconds)
            for top1, tokens in ((scored.top1, greedy), (again.top1, greedy[half:])):
                compared += len(tokens)
                matched += sum(a == b for a, b in zip(top1, tokens, strict=False))
    except UnusableAnswer as exc:
        return SelfTest.failed(
            _described(f"the engine answered unusable rows: {exc}", client, server)
        )
    if not agrees:
        return SelfTest(
            "failed",
            matched / max(compared, 1),
            compared,
            False,
            _described(
                "the engine's /tokenize disagrees with the configured tokenizer", client, server
            ),
            pacing.round_trip_s,
            pacing.token_s,
            time.time(),
        )
    if compared == 0:
        return SelfTest.failed(_described("the engine decoded nothing", client, server))
    rate = matched / compared
    state: State = "exact" if matched == compared else "approximate"
    detail = f"{state}: {matched}/{compared} greedy tokens agree"
    if state == "approximate":
        detail += f" ({rate:.3f})"
    return SelfTest(
        state,
        rate,
        compared,
        True,
        _described(detail, client, server),
        pacing.round_trip_s,
        pacing.token_s,
        time.time(),
    )


def _described(detail: str, client: EngineClient, server: str | None) -> str:
    """``detail`` with what the client learned about the engine and the server's version."""
    parts = [detail, *client.notes()]
    if server is not None:
        parts.append(f"server {client.name} {server}")
    return "; ".join(parts)
