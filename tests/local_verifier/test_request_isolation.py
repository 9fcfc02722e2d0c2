"""One failure fails one request: a fault injected into one request's drafting, its draft
(a token id past the embedding) or its output handling ends that request with its error,
while the seven others sharing its steps finish with the text they get alone."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from arrivals import together
from spec_drafts import PassThrough, make_draft

from local_verifier.engine import Engine, GenerationRequest
from local_verifier.loader import LoadedModel
from lookup.draft import Draft
from tests.local_verifier.collect import Collector

PROMPTS = [f"x = {i}\ny = x + {i}\nprint(y)\n" for i in range(8)]


def make_engine(lm: LoadedModel) -> Engine:
    costs = [1e-3 + 1e-5 * r for r in range(32 + 8 + 1)]
    return Engine(lm, max_draft=8, token_budget=32, row_costs=costs, kv_cache_mb=4)


class Faulty:
    """A drafter that works for a few steps, then fails as ``fault`` says."""

    def __init__(self, fault: str, vocab: int) -> None:
        self.fault = fault
        self.vocab = vocab
        self.calls = 0

    def extend(self, tokens: Sequence[int]) -> None:
        if self.fault == "extend" and self.calls >= 3:
            raise RuntimeError("injected fault after sampling")

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft:
        self.calls += 1
        if self.calls < 3:
            return Draft.empty()
        if self.fault == "propose":
            raise RuntimeError("injected drafting fault")
        return make_draft([self.vocab + 5], [-1])  # past the embedding


def request(prompt: str) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=24)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("propose", "injected drafting fault"),
        ("past-embedding", "past the model's"),
        ("extend", "injected fault after sampling"),
    ],
)
def test_a_fault_ends_only_its_request(
    tiny_lm: LoadedModel, fault: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_lm)
    alone = []
    for prompt in PROMPTS[1:]:
        answer = Collector()
        engine.submit(request(prompt), answer)
        assert engine.wait_idle(60)
        alone.append(answer.text)
    if fault == "past-embedding":  # a drafter's bad id that its check would not catch
        monkeypatch.setattr(Draft, "check", lambda self, vocab: None)
    broken, others = Collector(), [Collector() for _ in PROMPTS[1:]]
    faulty = Faulty(fault, tiny_lm.config.vocab_size)
    with together(engine):
        engine.submit(request(PROMPTS[0]), broken, drafter=faulty, controller=PassThrough(k=4))
        for prompt, answer in zip(PROMPTS[1:], others, strict=True):
            engine.submit(request(prompt), answer)
    assert engine.wait_idle(60)
    assert message in str(broken.error)
    assert [a.text for a in others] == alone
    assert engine.pool.used() == 0  # the failed request's blocks went back too
    engine.close()
