"""Speculative sampling reproduces the target's distribution of 3-token continuations.

The check (``distribution_matches``): draw ``N`` continuations, and for every event
"the continuation starts with prefix ``s``" (all ``s`` of length 1, 2 and 3: ``M`` events)
compare the empirical frequency ``q`` with the exactly enumerated probability ``p``.
For a binomial count, the Chernoff bound gives ``P(q >= a) <= exp(-N KL(a || p))`` for
``a > p`` and the same below ``p``, so ``P(N KL(q || p) >= t) <= 2 exp(-t)`` per event.
A union bound over the ``M`` events makes the false-failure rate at most
``2 M exp(-t)``; choosing ``t = ln(2 M / 1e-6)`` keeps it below 1e-6 whatever ``N`` is.
The power comes from ``N``: the deliberately wrong rules below (always accept, forget to
zero the rejected token) must fail the same check.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

from local_verifier import step as step_module
from local_verifier.engine import Engine, GenerationRequest, TextDelta
from local_verifier.loader import LoadedModel
from local_verifier.logits_processors import Penalties, PenaltyState
from local_verifier.model import ModelConfig, Transformer
from local_verifier.sampling import SamplingParams, target_probs
from local_verifier.testing.kv_cache import KVCache, forward
from local_verifier.testing.penalties import adjust
from local_verifier.tokenizer import Tokenizer
from local_verifier.verify import Verdict, children_of, verify_sampled
from lookup.draft import Draft

FALSE_FAILURE = 1e-6
V = 6
LENGTH = 3


def kl_bernoulli(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)); infinite when q > 0 at p == 0."""
    total = 0.0
    for a, b in ((q, p), (1.0 - q, 1.0 - p)):
        if a > 0:
            if b <= 0:
                return math.inf
            total += a * math.log(a / b)
    return total


def distribution_matches(
    samples: Counter[tuple[int, ...]], exact: dict[tuple[int, ...], float]
) -> tuple[bool, float, float]:
    """(passes, largest N*KL over prefix events, threshold); see the module docstring."""
    n = sum(samples.values())
    events: dict[tuple[int, ...], tuple[int, float]] = {}
    for length in range(1, LENGTH + 1):
        counts: Counter[tuple[int, ...]] = Counter()
        for seq, count in samples.items():
            counts[seq[:length]] += count
        probs: dict[tuple[int, ...], float] = {}
        for seq, p in exact.items():
            probs[seq[:length]] = probs.get(seq[:length], 0.0) + p
        for prefix, p in probs.items():
            events[prefix] = (counts.get(prefix, 0), p)
        for prefix in counts:
            if prefix not in probs:
                events[prefix] = (counts[prefix], 0.0)
    threshold = math.log(2 * len(events) / FALSE_FAILURE)
    worst = max(n * kl_bernoulli(count / n, p) for count, p in events.values())
    return worst < threshold, worst, threshold


class SyntheticTarget:
    """A fixed random next-token distribution per context, peaked enough to matter."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def probs(self, context: tuple[int, ...]) -> torch.Tensor:
        if context not in self._cache:
            gen = torch.Generator().manual_seed(hash((self.seed, context)) & 0x7FFFFFFF)
            self._cache[context] = torch.softmax(2.0 * torch.randn(V, generator=gen), -1)
        return self._cache[context]

    def exact(self) -> dict[tuple[int, ...], float]:
        out = {}
        for seq in itertools.product(range(V), repeat=LENGTH):
            p = 1.0
            for i in range(LENGTH):
                p *= float(self.probs(seq[:i])[seq[i]])
            out[seq] = p
        return out


def adversarial_draft(
    target: SyntheticTarget, context: tuple[int, ...], step: int
) -> tuple[list[int], list[int]]:
    """Alternate chains of unlikely tokens and trees with several candidates per depth."""
    order = torch.argsort(target.probs(context)).tolist()  # least likely first
    if step % 2 == 0:
        return [order[0], order[1], order[-1]], [-1, 0, 1]
    # three candidates at depth 1 (rare, middling, likely), two children under each
    return [order[1], order[3], order[-1], 0, 1, 2, 3, 4, 5], [-1, -1, -1, 0, 0, 1, 1, 2, 2]


Rule = Callable[..., Verdict]


def multinomial(row: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(row.float(), 1, generator=generator))


def speculative_continuation(
    target: SyntheticTarget, rule: Rule, generator: torch.Generator
) -> tuple[int, ...]:
    out: tuple[int, ...] = ()
    step = 0
    while len(out) < LENGTH:
        tokens, parents = adversarial_draft(target, out, step)
        paths: list[tuple[int, ...]] = [out]
        for node, parent in enumerate(parents):
            paths.append(paths[parent + 1] + (tokens[node],))
        probs = torch.stack([target.probs(p) for p in paths])
        verdict = rule(probs, tokens, parents, generator, multinomial)
        out = out + tuple(tokens[n] for n in verdict.accepted) + (verdict.next_token,)
        step += 1
    return out[:LENGTH]


def always_accept(probs, tokens, parents, generator, sample) -> Verdict:  # type: ignore[no-untyped-def]
    """Wrong on purpose: takes the first child at every depth."""
    kids = children_of(parents)
    node, accepted = -1, []
    while kids.get(node):
        node = kids[node][0]
        accepted.append(node)
    return Verdict(accepted, sample(probs[node + 1], generator))


def no_renormalise(probs, tokens, parents, generator, sample) -> Verdict:  # type: ignore[no-untyped-def]
    """Wrong on purpose: after a rejection it samples from the unmodified p."""
    kids = children_of(parents)
    node, accepted = -1, []
    while True:
        row = probs[node + 1]
        chosen = None
        for child in kids.get(node, []):
            if float(torch.rand((), generator=generator)) < float(row[tokens[child]]):
                chosen = child
                break
        if chosen is None:
            return Verdict(accepted, sample(row, generator))
        accepted.append(chosen)
        node = chosen


def _run(rule: Rule, n: int, seed: int) -> tuple[bool, float, float]:
    target = SyntheticTarget(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    samples = Counter(speculative_continuation(target, rule, gen) for _ in range(n))
    return distribution_matches(samples, target.exact())


N_SYNTHETIC = 4000


def test_verify_sampled_matches_exact_distribution() -> None:
    ok, worst, threshold = _run(verify_sampled, N_SYNTHETIC, seed=11)
    assert ok, f"max N*KL {worst:.1f} >= {threshold:.1f}"


def test_check_detects_a_sampler_that_always_accepts() -> None:
    ok, worst, threshold = _run(always_accept, N_SYNTHETIC, seed=11)
    assert not ok, f"biased sampler passed: max N*KL {worst:.1f} < {threshold:.1f}"


def test_check_detects_a_sampler_that_forgets_to_renormalise() -> None:
    ok, worst, threshold = _run(no_renormalise, N_SYNTHETIC, seed=11)
    assert not ok, f"biased sampler passed: max N*KL {worst:.1f} < {threshold:.1f}"


# --- penalties, logit_bias and min_p: each tree row after its own ancestors --------------

PENALISED = Penalties(
    presence_penalty=0.9, frequency_penalty=0.7, repetition_penalty=1.6, logit_bias={2: 1.5}
)
PENALISED_PARAMS = SamplingParams(temperature=0.9, min_p=0.04)
SYN_PROMPT = (1, 3)
N_PENALISED = 2500


def _raw(target: SyntheticTarget, context: tuple[int, ...]) -> torch.Tensor:
    return target.probs(context).log()


def _penalised_exact(target: SyntheticTarget) -> dict[tuple[int, ...], float]:
    rows: dict[tuple[int, ...], torch.Tensor] = {}

    def row(context: tuple[int, ...]) -> torch.Tensor:
        if context not in rows:
            logits = adjust(_raw(target, context), PENALISED, SYN_PROMPT, context)
            rows[context] = target_probs(logits, PENALISED_PARAMS)
        return rows[context]

    return {
        seq: math.prod(float(row(seq[:i])[seq[i]]) for i in range(LENGTH))
        for seq in itertools.product(range(V), repeat=LENGTH)
    }


def _penalised_continuation(
    target: SyntheticTarget, generator: torch.Generator, ancestors: bool
) -> tuple[int, ...]:
    """Trees drafted and verified with rows adjusted by ``PenaltyState.rows`` (``ancestors``
    False: wrong on purpose, every row adjusted as if it followed the committed tokens)."""
    out: tuple[int, ...] = ()
    step = 0
    while len(out) < LENGTH:
        tokens, parents = adversarial_draft(target, out, step)
        paths: list[tuple[int, ...]] = [out]
        for node, parent in enumerate(parents):
            paths.append(paths[parent + 1] + (tokens[node],))
        raw = torch.stack([_raw(target, p) for p in paths])
        if ancestors:
            state = PenaltyState(PENALISED, [*SYN_PROMPT, *out], len(SYN_PROMPT), V, raw.device)
            rows = state.rows(raw, tokens, parents)
        else:
            rows = torch.stack([adjust(r, PENALISED, SYN_PROMPT, out) for r in raw])
        probs = target_probs(rows, PENALISED_PARAMS)
        verdict = verify_sampled(probs, tokens, parents, generator, multinomial)
        out = out + tuple(tokens[n] for n in verdict.accepted) + (verdict.next_token,)
        step += 1
    return out[:LENGTH]


@pytest.mark.slow
@pytest.mark.parametrize("ancestors", [True, False], ids=["right", "committed-only"])
def test_penalised_trees_match_exact_distribution(ancestors: bool) -> None:
    target = SyntheticTarget(seed=5)
    gen = torch.Generator().manual_seed(5)
    samples = Counter(_penalised_continuation(target, gen, ancestors) for _ in range(N_PENALISED))
    ok, worst, threshold = distribution_matches(samples, _penalised_exact(target))
    if ancestors:
        assert ok, f"max N*KL {worst:.1f} >= {threshold:.1f}"
    else:
        assert not ok, f"wrong histories passed: max N*KL {worst:.1f} < {threshold:.1f}"


# --- the same check through the decoding loop on a tiny random-weight model -------------

TINY_V = 8
PROMPT = [1, 5, 2]


class TreeDrafter:
    """An adversarial drafter: a tree of the target's 2nd, 1st and 4th most likely tokens.

    Drafts that are likely but not certain make the acceptance rule matter most (a wrong
    residual or acceptance probability shows up in the distribution). Each depth-1
    candidate gets one child (its own 2nd most likely continuation), so rejected
    siblings, the residual distribution and bonus tokens are all exercised. The draft is a
    deterministic function of the context, as lookup drafts are.
    """

    def __init__(self, table: dict[tuple[int, ...], torch.Tensor]) -> None:
        self.table = table
        self.context: tuple[int, ...] = ()

    def extend(self, tokens: Sequence[int]) -> None:
        self.context += tuple(int(t) for t in tokens)

    def _ranked(self, context: tuple[int, ...], ranks: Sequence[int]) -> list[int]:
        order = torch.argsort(self.table[context], descending=True).tolist()
        return [order[r] for r in ranks]

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft:
        first = self._ranked(self.context, (1, 0, 3))
        tokens, parents = list(first), [-1] * len(first)
        if len(self.context) + 1 < LENGTH:
            for node, token in enumerate(first):
                tokens += self._ranked(self.context + (token,), (1,))
                parents.append(node)
        n = min(max_tokens, len(tokens))
        return Draft(
            np.asarray(tokens[:n], np.int64),
            np.asarray(parents[:n], np.int32),
            np.ones(n, np.float32),
            np.zeros(n, np.int8),
        )


class PassThrough:
    """A controller that verifies every draft as proposed."""

    def budget(self) -> tuple[int, int]:
        return 8, 3

    def choose(self, draft: Draft) -> Draft:
        return draft

    def observe(self, drafted: int, accepted: int) -> None:
        return None


PARAMS = SamplingParams(temperature=0.8, top_k=6, seed=0)


@pytest.fixture(scope="module")
def tiny_model() -> Transformer:
    cfg = ModelConfig(
        vocab_size=TINY_V,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        hidden_dim=64,
        max_seq_len=32,
    )
    model = Transformer.from_config(cfg)
    with torch.no_grad():  # sharpen the random head so the distribution is far from uniform
        model.head.weight.mul_(40.0)
    return model


def _target_table(model: Transformer) -> dict[tuple[int, ...], torch.Tensor]:
    """The target's next-token distribution after every context of length 0..LENGTH-1."""

    def probs(context: tuple[int, ...]) -> torch.Tensor:
        cache = KVCache(model.config, 16)
        logits = forward(model, torch.tensor(PROMPT + list(context)), cache, last_only=True)[-1]
        return target_probs(logits, PARAMS)

    return {
        seq: probs(seq)
        for length in range(LENGTH)
        for seq in itertools.product(range(TINY_V), repeat=length)
    }


def _exact_tiny(table: dict[tuple[int, ...], torch.Tensor]) -> dict[tuple[int, ...], float]:
    return {
        seq: math.prod(float(table[seq[:i]][seq[i]]) for i in range(LENGTH))
        for seq in itertools.product(range(TINY_V), repeat=LENGTH)
    }


def _tiny_engine(model: Transformer) -> Engine:
    """The serving engine on the tiny model (a one-character-per-id tokenizer, no EOS)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    vocab = {chr(ord("a") + i): i for i in range(TINY_V)}
    tokenizer = Tokenizer(Backend(models.WordLevel(vocab, unk_token="a")), eos_ids=set())
    lm = LoadedModel(model, model.config, tokenizer, model.device, model.dtype, "tiny")
    return Engine(lm, max_draft=8, token_budget=8, row_costs=[1.0] * 17, kv_cache_mb=0.25)


def _sampled_tiny(
    model: Transformer, table: dict[tuple[int, ...], torch.Tensor], n: int
) -> Counter[tuple[int, ...]]:
    engine = _tiny_engine(model)
    out: Counter[tuple[int, ...]] = Counter()
    for seed in range(n):
        params = SamplingParams(temperature=PARAMS.temperature, top_k=PARAMS.top_k, seed=seed)
        req = GenerationRequest(prompt_ids=PROMPT, params=params, max_tokens=LENGTH)
        items = engine.generate(req, drafter=TreeDrafter(table), controller=PassThrough())
        tokens = [t for i in items if isinstance(i, TextDelta) for t in i.token_ids]
        out[tuple(tokens)] += 1
    return out


N_TINY = 1500


@pytest.mark.slow
def test_decoding_loop_samples_the_target_distribution(tiny_model: Transformer) -> None:
    table = _target_table(tiny_model)
    exact = _exact_tiny(table)
    assert max(exact.values()) > 0.05  # the sharpened model is far from uniform
    ok, worst, threshold = distribution_matches(_sampled_tiny(tiny_model, table, N_TINY), exact)
    assert ok, f"max N*KL {worst:.1f} >= {threshold:.1f}"


@pytest.mark.slow
def test_decoding_loop_check_detects_a_wrong_rule(
    tiny_model: Transformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_module, "verify_sampled", no_renormalise)
    table = _target_table(tiny_model)
    samples = _sampled_tiny(tiny_model, table, N_TINY)
    ok, worst, threshold = distribution_matches(samples, _exact_tiny(table))
    assert not ok, f"biased loop passed: max N*KL {worst:.1f} < {threshold:.1f}"


# --- a grammar's mask is part of the target distribution (trees, through the loop) --------

GRAMMAR_EOS = 7  # h
GRAMMAR_REGEX = "([a-d][e-g]|[e-g][a-d])[a-c]"  # ids a..g = 0..6


def _grammar_allowed(context: tuple[int, ...]) -> torch.Tensor:
    """An oracle written apart from the engine: what GRAMMAR_REGEX allows after ``context``."""
    ok = [{0, 1, 2, 3, 4, 5, 6}, {4, 5, 6} if context[:1] < (4,) else {0, 1, 2, 3}, {0, 1, 2}]
    return torch.tensor([t in ok[len(context)] for t in range(TINY_V)])


def _grammar_exact(model: Transformer) -> dict[tuple[int, ...], float]:
    def probs(context: tuple[int, ...]) -> torch.Tensor:
        cache = KVCache(model.config, 16)
        logits = forward(model, torch.tensor(PROMPT + list(context)), cache, last_only=True)[-1]
        masked = logits.float().masked_fill(~_grammar_allowed(context), float("-inf"))
        return target_probs(masked, PARAMS)

    rows = {
        seq: probs(seq)
        for length in range(LENGTH)
        for seq in itertools.product(range(TINY_V), repeat=length)
    }
    return _exact_tiny(rows)


def _sampled_grammar(
    model: Transformer, table: dict[tuple[int, ...], torch.Tensor], n: int
) -> Counter[tuple[int, ...]]:
    from llguidance import LLMatcher
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models

    backend = Backend(models.WordLevel({chr(ord("a") + i): i for i in range(TINY_V)}, "a"))
    backend.decoder = decoders.ByteLevel()  # llguidance reads the decoder's kind
    tokenizer = Tokenizer(backend, eos_ids={GRAMMAR_EOS})
    lm = LoadedModel(model, model.config, tokenizer, model.device, model.dtype, "tiny")
    engine = Engine(lm, max_draft=8, token_budget=8, row_costs=[1.0] * 17, kv_cache_mb=0.25)
    grammar = LLMatcher.grammar_from_regex(GRAMMAR_REGEX)
    out: Counter[tuple[int, ...]] = Counter()
    for seed in range(n):
        params = SamplingParams(temperature=PARAMS.temperature, top_k=PARAMS.top_k, seed=seed)
        req = GenerationRequest(
            prompt_ids=PROMPT, params=params, max_tokens=LENGTH, grammar=grammar
        )
        # the drafter ranks tokens without the mask: many of its nodes are pruned
        items = engine.generate(req, drafter=TreeDrafter(table), controller=PassThrough())
        tokens = [t for i in items if isinstance(i, TextDelta) for t in i.token_ids]
        out[tuple(tokens)] += 1
    return out


@pytest.mark.slow
def test_grammar_trees_sample_the_masked_target_distribution(tiny_model: Transformer) -> None:
    table = _target_table(tiny_model)
    samples = _sampled_grammar(tiny_model, table, N_TINY)
    ok, worst, threshold = distribution_matches(samples, _grammar_exact(tiny_model))
    assert ok, f"max N*KL {worst:.1f} >= {threshold:.1f}"
    unmasked, *_ = distribution_matches(samples, _exact_tiny(table))
    assert not unmasked  # the mask changed the distribution: the check sees it
