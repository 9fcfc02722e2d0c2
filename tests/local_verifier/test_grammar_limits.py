"""A grammar that compiles under LIMITS but exceeds a per-token limit later in an answer
(SmolLM2's tokenizer, real llguidance): the answer ends with GrammarLimitExceeded, whether
the limit is hit consuming an emitted token, walking a draft path or computing a mask; its
message is the client's; a token the grammar rejects is still the engine's RuntimeError;
the other requests in the engine go on."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from local_verifier import step as step_module
from local_verifier.engine import END, Engine, GenerationRequest, GenerationStats
from local_verifier.grammar import (
    Constraint,
    DraftRowOverLimit,
    GrammarCompiler,
    GrammarLimitExceeded,
    InvalidGrammar,
    JsonSchema,
    MaskedRows,
)
from local_verifier.loader import LoadedModel
from local_verifier.sampling import SamplingParams
from tests.local_verifier.collect import Collector

# 600 optional properties: the grammar compiles (under max_grammar_size), but the parser
# row after the object's "{" holds ~2,400 items, over max_items_in_row (2,000)
WIDE: dict[str, Any] = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string"} for i in range(600)},
}
# the wide object one key deep: its "{" comes a few tokens into the answer
NESTED: dict[str, Any] = {
    "type": "object",
    "properties": {"a": WIDE},
    "required": ["a"],
    "additionalProperties": False,
}
# a pattern whose lexer states multiply with each "a" read: a mask some tokens into the
# string runs out of step_lexer_fuel
PATTERN: dict[str, Any] = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^(.*)a.{20}$"}},
    "required": ["s"],
}
CLIENT_MESSAGE = re.compile(
    r"response_format's grammar exceeded the engine's per-token grammar limits after "
    r"(\d+) output tokens?; simplify the schema \(.*\)"
)


@pytest.fixture(scope="module")
def compiler(smollm2: LoadedModel) -> GrammarCompiler:
    return GrammarCompiler(smollm2.tokenizer, smollm2.config.vocab_size)


def ids(smollm2: LoadedModel, text: str) -> list[int]:
    return smollm2.tokenizer.backend.encode(text, add_special_tokens=False).ids


def constraint(compiler: GrammarCompiler, schema: dict[str, Any]) -> Constraint:
    return compiler.compile(JsonSchema(schema)).constraint()  # within LIMITS: it compiles


def check(error: GrammarLimitExceeded, tokens: int, reason: str) -> None:
    """The client's message names the tokens and nothing of llguidance's; the log's
    reason is llguidance's."""
    assert isinstance(error, InvalidGrammar)
    match = CLIENT_MESSAGE.fullmatch(str(error))
    assert match is not None, str(error)
    assert int(match.group(1)) == error.tokens == tokens
    assert reason in error.reason and reason not in str(error)
    assert "\n" not in str(error) and "non-verbose" not in error.reason


def test_an_emitted_token_over_the_row_limit(
    compiler: GrammarCompiler, smollm2: LoadedModel
) -> None:
    answer = ids(smollm2, '{"a": {"p1": "x"}}')
    # the token with the inner "{", some tokens into the answer
    first = next(i for i, t in enumerate(answer) if i and "{" in smollm2.tokenizer.decode([t]))
    assert first >= 2
    grammar = constraint(compiler, NESTED)
    for token in answer[:first]:
        assert not grammar.forbidden([])[token]
        grammar.commit([token])
    over = grammar.commit([answer[first]])
    assert over is not None
    check(over, first, "Current row has")

    top = constraint(compiler, WIDE)
    over = top.commit(ids(smollm2, "{"))
    assert over is not None
    check(over, 0, "max is 2000")


def test_a_commit_takes_the_tokens_before_the_one_over_the_limit(
    compiler: GrammarCompiler, smollm2: LoadedModel
) -> None:
    """A step's tokens are committed in order, as plain decoding commits them one a step."""
    answer = ids(smollm2, '{"a": {"p1": "x"}}')
    first = next(i for i, t in enumerate(answer) if i and "{" in smollm2.tokenizer.decode([t]))
    grammar = constraint(compiler, NESTED)
    over = grammar.commit(answer)
    assert over is not None
    check(over, first, "Current row has")
    assert grammar.committed == first


def test_a_draft_path_over_the_row_limit(compiler: GrammarCompiler, smollm2: LoadedModel) -> None:
    """The draft node passes pruning (llguidance validates it), then its row's mask fails."""
    answer = ids(smollm2, '{"a": {"p1": "x"}}')
    grammar = constraint(compiler, NESTED)
    grammar.commit(answer[:1])
    with pytest.raises(GrammarLimitExceeded) as err:
        grammar.forbidden(answer[1:4])
    check(err.value, 1, "Current row has")
    # the draft path was walked on a copy: the committed state goes on
    assert not grammar.forbidden([])[answer[1]]
    assert grammar.commit(answer[1:3]) is None and grammar.committed == 3


def test_a_draft_row_over_the_limit_stops_the_rows(
    compiler: GrammarCompiler, smollm2: LoadedModel
) -> None:
    """Row 0 over a limit is the answer's error; a draft row's is DraftRowOverLimit, and
    committing its path fails where plain decoding fails on it: consuming a token (a
    parser row) or masking after the path (lexer fuel, which llguidance's copies share)."""
    answer = ids(smollm2, '{"a": {"p1": "x"}}')
    first = next(i for i, t in enumerate(answer) if i and "{" in smollm2.tokenizer.decode([t]))
    grammar = constraint(compiler, NESTED)
    path = answer[: first + 2]
    rows = grammar.rows(
        torch.zeros(len(path) + 1, smollm2.config.vocab_size), path, list(range(-1, len(path) - 1))
    )
    assert rows[first].shape == (smollm2.config.vocab_size,)
    with pytest.raises(DraftRowOverLimit) as stop:
        rows[first + 1]
    assert stop.value.row == first + 1
    over = grammar.commit(path[: first + 1])  # the step ends with the row's node
    assert over is not None
    check(over, first, "Current row has")

    a = ids(smollm2, '{"s": "' + "a" * 60)
    plain = constraint(compiler, PATTERN)
    done = 0
    while done < len(a):
        try:
            plain.forbidden([])
        except GrammarLimitExceeded as err:
            failed = err
            break
        assert plain.commit(a[done : done + 1]) is None
        done += 1
    check(failed, done, "too many expressions")
    drafted = constraint(compiler, PATTERN)
    rows = drafted.rows(
        torch.zeros(done + 2, smollm2.config.vocab_size), a[: done + 1], list(range(-1, done))
    )
    for row in range(done):
        rows[row]
    with pytest.raises(DraftRowOverLimit):
        rows[done]
    over = drafted.commit(a[:done])
    assert over is not None
    check(over, done, "too many expressions")


def test_a_mask_over_the_step_lexer_fuel(compiler: GrammarCompiler, smollm2: LoadedModel) -> None:
    """The failed mask is an error, never the EOS-only mask llguidance returns with it."""
    answer = ids(smollm2, '{"s": "' + "abaababbbaabbabaaabbbababbbaaaba" * 2)
    grammar = constraint(compiler, PATTERN)
    done = 0
    with pytest.raises(GrammarLimitExceeded) as err:
        for token in answer:
            assert not grammar.forbidden([])[token]
            grammar.commit([token])
            done += 1
    assert 0 < done < len(answer)  # the first masks along the string were computed
    check(err.value, done, "lexer error: too many expressions constructed")


def test_a_rejected_token_is_the_engine_error(
    compiler: GrammarCompiler, smollm2: LoadedModel
) -> None:
    grammar = constraint(compiler, NESTED)
    (token,) = ids(smollm2, "x")
    assert grammar.forbidden([])[token]
    with pytest.raises(RuntimeError, match="^grammar rejected an emitted token: ") as err:
        grammar.commit([token])
    assert not isinstance(err.value, InvalidGrammar)


def test_the_limit_ends_only_its_answer(engine: Engine) -> None:
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    wide = GenerationRequest(messages=messages, max_tokens=16, grammar=JsonSchema(NESTED))
    plain = GenerationRequest(messages=messages, max_tokens=16, grammar=JsonSchema())
    alone = Collector()
    engine.submit(plain, alone)
    assert engine.wait_idle(120)
    failing, other = Collector(), Collector()
    engine.submit(wide, failing)
    engine.submit(plain, other)
    assert engine.wait_idle(120)
    assert failing.items[-1] is END
    error = failing.error
    assert isinstance(error, GrammarLimitExceeded)
    assert 0 < error.tokens == len(failing.ids)  # the tokens sent before it
    assert other.items[-1] is END and isinstance(other.items[-2], GenerationStats)
    assert other.ids == alone.ids


PERSON = "Describe a person as JSON."
A_STRING = 'Reply with the JSON {"s": "' + "a" * 40 + '"}'


def run(engine: Engine, request: GenerationRequest) -> Collector:
    answer = Collector()
    engine.submit(request, answer)
    assert engine.wait_idle(120)
    assert answer.items[-1] is END
    return answer


def failure(answer: Collector) -> GrammarLimitExceeded:
    error = answer.error
    assert isinstance(error, GrammarLimitExceeded)
    return error


class Spy:
    """Records, through the engine's thread, the failed commits and the draft rows over a
    limit."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failed_commits: list[list[int]] = []  # each: the step's tokens
        self.rows_over = 0
        commit, getitem = Constraint.commit, MaskedRows.__getitem__

        def spied_commit(grammar: Constraint, tokens: Any) -> GrammarLimitExceeded | None:
            over = commit(grammar, tokens)
            if over is not None:
                self.failed_commits.append([int(t) for t in tokens])
            return over

        def spied_getitem(rows: MaskedRows, row: int) -> torch.Tensor:
            try:
                return getitem(rows, row)
            except DraftRowOverLimit:
                self.rows_over += 1
                raise

        monkeypatch.setattr(Constraint, "commit", spied_commit)
        monkeypatch.setattr(MaskedRows, "__getitem__", spied_getitem)
        # every proposed node verified: the steps' drafts are the prediction's next max_draft
        # tokens, not what the timed planner keeps
        monkeypatch.setattr(step_module, "plan_batch", lambda drafts, *_, **__: list(drafts))


def request(schema: dict[str, Any], content: str, **kwargs: Any) -> GenerationRequest:
    kwargs.setdefault("max_tokens", 16)
    return GenerationRequest(
        messages=[{"role": "user", "content": content}], grammar=JsonSchema(schema), **kwargs
    )


def test_drafts_fail_where_plain_decoding_fails(
    engine: Engine, smollm2: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy, with a prediction drafted through the failing point: the same tokens are
    streamed and the error counts the same tokens as with drafts off, whether the step's
    last (bonus) token, a draft token or the mask after the draft path is over the limit."""
    spy = Spy(monkeypatch)
    plain = run(engine, request(NESTED, PERSON, draft=False))
    n = failure(plain).tokens
    assert 0 < n == len(plain.ids)
    # the first verify step drafts plain's next 4 tokens: its bonus token is over the limit
    prediction = plain.ids + ids(smollm2, '{"p1": 1}}')
    bonus = run(engine, request(NESTED, PERSON, prediction_ids=prediction, max_draft=4))
    assert bonus.ids == plain.ids and failure(bonus).tokens == n
    (alone, step) = spy.failed_commits  # plain decoding's one token, the drafted step's
    assert step[:-1] == plain.ids[1:] and alone == step[-1:]
    # drafts of 3: the second step drafts the token over the limit, the row after it fails
    prediction = [*plain.ids, *alone, *ids(smollm2, '"p1": 1}}')]
    drafted = run(engine, request(NESTED, PERSON, prediction_ids=prediction, max_draft=3))
    assert drafted.ids == plain.ids and failure(drafted).tokens == n
    assert spy.rows_over == 1 and spy.failed_commits[-1] == alone

    plain = run(engine, request(PATTERN, A_STRING, draft=False))
    n = failure(plain).tokens
    assert 0 < n == len(plain.ids)
    assert n % 4 == 0  # drafts of 3: a step's last draft row is the mask over the limit
    prediction = plain.ids + ids(smollm2, "a" * 40)
    drafted = run(engine, request(PATTERN, A_STRING, prediction_ids=prediction, max_draft=3))
    assert drafted.ids == plain.ids and failure(drafted).tokens == n
    assert spy.rows_over == 2 and len(spy.failed_commits[-1]) == 3


def test_drafts_end_where_plain_decoding_ends_before_the_limit(
    engine: Engine, smollm2: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop string, or max_tokens, ends the answer before the token or mask over the
    limit: with drafts through that point, no error and the same tokens."""
    spy = Spy(monkeypatch)
    nested = run(engine, request(NESTED, PERSON, draft=False)).ids
    pattern = run(engine, request(PATTERN, A_STRING, draft=False)).ids
    cases: list[tuple[dict[str, Any], str, dict[str, Any], list[int]]] = [
        # the stop string ends with plain's last token, in the step whose bonus is over
        (NESTED, PERSON, {"stop": ['"a"'], "max_draft": 4}, ids(smollm2, '{"p1": 1}}')),
        # the answer's last token is a draft row's node, the mask after it is over
        (PATTERN, A_STRING, {"max_tokens": len(pattern), "max_draft": 3}, []),
    ]
    for schema, content, kwargs, more in cases:
        prediction = (nested if schema is NESTED else pattern) + more + ids(smollm2, "a" * 40)
        off = run(engine, request(schema, content, draft=False, **kwargs))
        on = run(engine, request(schema, content, prediction_ids=prediction, **kwargs))
        stats = [answer.items[-2] for answer in (off, on)]
        assert all(isinstance(s, GenerationStats) for s in stats), stats
        assert on.ids == off.ids
    assert len(spy.failed_commits) == 2  # plain decoding's under NESTED, the stop case's
    assert len(spy.failed_commits[-1]) == 5 and spy.failed_commits[-1][:-1] == nested[1:]


def test_sampled_drafts_fail_where_plain_sampling_fails(
    engine: Engine, smollm2: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded: one draw a token with drafts on or off, so the same answer and failure."""
    spy = Spy(monkeypatch)
    params = SamplingParams(temperature=0.5, seed=7)
    plain = run(engine, request(PATTERN, A_STRING, draft=False, params=params))
    n = failure(plain).tokens
    prediction = plain.ids + ids(smollm2, "a" * 40)
    drafted = run(
        engine, request(PATTERN, A_STRING, params=params, prediction_ids=prediction, max_draft=3)
    )
    assert drafted.ids == plain.ids and failure(drafted).tokens == n
    assert spy.rows_over == 1
