"""The grammar's token mask (local_verifier.grammar) on a tiny vocabulary, checked against
a hand-written oracle of the same language: pruned drafts, masked verify rows in any order
(the matcher rolls back and forth along draft paths), greedy decoding through the engine
equal with and without drafts. The compile: bad grammars and schemas and ones over
LIMITS rejected with a reason, one compile for a request's n answers, equal to the
single answers."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch
from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from spec_drafts import PassThrough, make_draft
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models

from local_verifier import grammar as grammar_module
from local_verifier.engine import END, Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.grammar import GrammarCompiler, InvalidGrammar, JsonSchema
from local_verifier.loader import LoadedModel
from local_verifier.model import ModelConfig, Transformer
from local_verifier.sampling import SamplingParams
from local_verifier.tokenizer import Tokenizer
from lookup.draft import Draft

V = 8  # tokens a..h; h (7) is the end-of-sequence token
EOS = 7
REGEX = "([a-d][e-g]|[e-g][a-d])[a-c]"
GRAMMAR = LLMatcher.grammar_from_regex(REGEX)


def allowed(context: Sequence[int]) -> set[int]:
    """The oracle: the tokens REGEX allows after ``context`` (ids 0..6 = a..g, then EOS)."""
    if len(context) == 0:
        return set(range(EOS))
    if len(context) == 1:
        return {4, 5, 6} if context[0] <= 3 else {0, 1, 2, 3}
    if len(context) == 2:
        return {0, 1, 2}
    return {EOS}


def tiny_tokenizer() -> Tokenizer:
    backend = Backend(models.WordLevel({chr(ord("a") + i): i for i in range(V)}, unk_token="a"))
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, eos_ids={EOS})


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(tiny_tokenizer(), V)


def paths_of(tokens: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    paths: list[list[int]] = [[]]
    for token, parent in zip(tokens, parents, strict=True):
        paths.append([*paths[parent + 1], token])
    return paths


# every depth-1 token under the root, two children under each: most paths are forbidden
TREE_TOKENS = [0, 5, 7, 4, 1, 0, 6, 2, 3]
TREE_PARENTS = [-1, -1, -1, 0, 0, 1, 1, 2, 2]


def test_prune_keeps_exactly_the_allowed_paths(compiler: GrammarCompiler) -> None:
    constraint = compiler.compile(GRAMMAR).constraint()
    constraint.commit([])
    draft = make_draft(TREE_TOKENS, TREE_PARENTS)
    kept = constraint.prune(draft)
    expected = [
        path
        for path in paths_of(TREE_TOKENS, TREE_PARENTS)[1:]
        if all(path[i] in allowed(path[:i]) for i in range(len(path)))
    ]
    assert sorted(paths_of(kept.tokens.tolist(), kept.parents.tolist())[1:]) == sorted(expected)
    assert len(kept) < len(draft)


def test_prune_after_committed_tokens(compiler: GrammarCompiler) -> None:
    constraint = compiler.compile(GRAMMAR).constraint()
    constraint.commit([5])  # now only a..d, then a..c
    kept = constraint.prune(make_draft([1, 0, 4, 2], [-1, 0, -1, 1]))
    assert kept.tokens.tolist() == [1, 0] and kept.parents.tolist() == [-1, 0]
    assert len(constraint.prune(Draft.empty())) == 0


@pytest.mark.parametrize("committed", [[], [2]])
def test_rows_are_masked_with_each_node_path_in_any_order(
    compiler: GrammarCompiler, committed: list[int]
) -> None:
    constraint = compiler.compile(GRAMMAR).constraint()
    constraint.commit(committed)
    draft = constraint.prune(make_draft(TREE_TOKENS, TREE_PARENTS))
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    logits = torch.randn(len(draft) + 1, V, generator=torch.Generator().manual_seed(0))
    rows = constraint.rows(logits, tokens, parents)
    paths = paths_of(tokens, parents)
    order = np.random.default_rng(0).permutation(len(paths)).tolist()
    for row in [*order, *order[::-1]]:
        masked = rows[row]
        ok = allowed(committed + paths[row])
        expected = torch.where(
            torch.tensor([t in ok for t in range(V)]), logits[row], float("-inf")
        )
        assert torch.equal(masked, expected), (row, paths[row])
    constraint.commit([5])  # the committed state is intact after the visits
    expected_next = torch.tensor([t not in allowed([*committed, 5]) for t in range(V)])
    assert torch.equal(constraint.forbidden([]), expected_next)


def test_compile_accepts_schemas_and_rejects_bad_ones_with_the_reason(
    compiler: GrammarCompiler,
) -> None:
    compiler.compile(JsonSchema())
    compiler.compile(JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    for bad, reason in [
        ({"type": "strin"}, "Invalid type: strin"),
        ({"$ref": "#/missing"}, "Pointer '/missing' does not exist"),
        ({"type": "string", "maxLength": "x"}, "maxLength"),
    ]:
        with pytest.raises(InvalidGrammar, match=f"^invalid JSON schema: .*{reason}"):
            compiler.compile(JsonSchema(bad))
    with pytest.raises(InvalidGrammar, match="^invalid grammar: .*lexer error"):
        compiler.compile("start: %%")


def test_a_schema_over_the_limits_is_rejected_at_compile(compiler: GrammarCompiler) -> None:
    names = [f"p{i}" for i in range(3000)]  # each required property costs grammar symbols
    wide = {"type": "object", "properties": {n: {"type": "string"} for n in names}}
    with pytest.raises(InvalidGrammar, match=r"grammar size .* too big \(limit .*: 10000\)$"):
        compiler.compile(JsonSchema({**wide, "required": names}))


def test_a_first_mask_over_the_limits_is_rejected_at_compile(
    compiler: GrammarCompiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = LLParserLimits(step_lexer_fuel=1, verbose_errors=False)
    monkeypatch.setattr(grammar_module, "LIMITS", limits)
    # the message names the limit and carries no parser state
    with pytest.raises(InvalidGrammar, match="^invalid grammar: lexer error: [^\n]*$"):
        compiler.compile(GRAMMAR)


def test_threads_compiling_at_once_build_one_token_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiler = GrammarCompiler(tiny_tokenizer(), V)
    held: list[bool] = []  # per build: whether the compiler's lock was held

    def build(*args: Any, **kwargs: Any) -> LLTokenizer:
        held.append(compiler._lock.locked())
        return LLTokenizer(*args, **kwargs)

    monkeypatch.setattr(grammar_module, "LLTokenizer", build)
    start = threading.Barrier(4)

    def compile_one(_: int) -> torch.Tensor:
        start.wait()
        return compiler.compile(GRAMMAR).constraint().forbidden([])

    with ThreadPoolExecutor(4) as pool:
        masks = list(pool.map(compile_one, range(4)))
    assert held == [True]
    expected = torch.tensor([t not in allowed([]) for t in range(V)])
    assert all(torch.equal(mask, expected) for mask in masks)


# --- through the engine: drafts and n answers change nothing, bitwise -------------------


class EveryToken:
    """Drafts every token as a child of the root, each with one child: the grammar prunes
    the forbidden ones, the target's choice among the rest is accepted."""

    def extend(self, tokens: Sequence[int]) -> None:
        return None

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft:
        tokens = list(range(V)) + [(3 * t + 1) % V for t in range(V)]
        parents = [-1] * V + list(range(V))
        return make_draft(tokens[:max_tokens], parents[:max_tokens])


@pytest.fixture(scope="module")
def engine() -> Engine:
    cfg = ModelConfig(
        vocab_size=V, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
        hidden_dim=64, max_seq_len=32,
    )  # fmt: skip
    model = Transformer.from_config(cfg)
    lm = LoadedModel(model, cfg, tiny_tokenizer(), model.device, model.dtype, "tiny")
    return Engine(lm, max_draft=16, token_budget=8, row_costs=[1.0] * 25, kv_cache_mb=0.25)


def test_engine_greedy_with_grammar_is_identical_with_and_without_drafts(engine: Engine) -> None:
    for prompt in ([1, 5, 2], [7, 7], [0]):
        runs = []
        for draft in (False, True):
            req = GenerationRequest(prompt_ids=prompt, max_tokens=8, grammar=GRAMMAR, draft=draft)
            items = list(engine.generate(req, drafter=EveryToken(), controller=PassThrough(16, 8)))
            stats = items[-1]
            assert isinstance(stats, GenerationStats)
            runs.append(
                ([t for i in items if isinstance(i, TextDelta) for t in i.token_ids], stats)
            )
        (plain, _), (drafted, stats) = runs
        assert drafted == plain
        assert len(plain) == 3 and all(plain[i] in allowed(plain[:i]) for i in range(3))
        assert stats.finish_reason == "stop"  # the grammar ended it with EOS
        assert stats.accepted_tokens > 0 and stats.grammar_s > 0


class CountingMatcher:
    """Stands in for llguidance's LLMatcher in local_verifier.grammar: counts compiles."""

    built = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> LLMatcher:  # type: ignore[misc]
        cls.built += 1
        return LLMatcher(*args, **kwargs)


def tokens_of(items: Sequence[object]) -> list[int]:
    return [t for i in items if isinstance(i, TextDelta) for t in i.token_ids]


def test_n_answers_compile_once_and_equal_single_answers_with_seed_plus_index(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grammar_module, "LLMatcher", CountingMatcher)
    params = SamplingParams(temperature=1.0, seed=11)
    req = GenerationRequest(
        prompt_ids=[1, 5, 2, 1, 5], params=params, max_tokens=8, grammar=GRAMMAR
    )
    items: list[list[object]] = [[], [], []]
    engine.submit_n(req, 3, lambda i, item: items[i].append(item))
    assert engine.wait_idle(60)
    assert CountingMatcher.built == 1  # one compile; each answer masks with a copy
    assert all(got[-1] is END and isinstance(got[-2], GenerationStats) for got in items)
    answers = [tokens_of(got) for got in items]
    assert len({tuple(a) for a in answers}) > 1  # the seeds differ
    for i, answer in enumerate(answers):
        assert len(answer) == 3 and all(answer[j] in allowed(answer[:j]) for j in range(3))
        for draft in (False, True):
            single = GenerationRequest(
                prompt_ids=req.prompt_ids,
                params=SamplingParams(temperature=1.0, seed=11 + i),
                max_tokens=8,
                grammar=GRAMMAR,
                draft=draft,
            )
            assert tokens_of(list(engine.generate(single))) == answer
    assert CountingMatcher.built == 7  # one compile per request, never one per answer
