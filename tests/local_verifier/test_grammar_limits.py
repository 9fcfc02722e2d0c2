"""A grammar that compiles under LIMITS but exceeds a per-token limit later in an answer
(SmolLM2's tokenizer, real llguidance): the answer ends with GrammarLimitExceeded, whether
the limit is hit consuming an emitted token, walking a draft path or computing a mask; its
message is the client's; a token the grammar rejects is still the engine's RuntimeError;
the other requests in the engine go on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from local_verifier.engine import END, Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.grammar import (
    Constraint,
    GrammarCompiler,
    GrammarLimitExceeded,
    InvalidGrammar,
    JsonSchema,
)
from local_verifier.loader import LoadedModel

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
    with pytest.raises(GrammarLimitExceeded) as err:
        grammar.commit([answer[first]])
    check(err.value, first, "Current row has")

    top = constraint(compiler, WIDE)
    with pytest.raises(GrammarLimitExceeded) as err:
        top.commit(ids(smollm2, "{"))
    check(err.value, 0, "max is 2000")


def test_a_draft_path_over_the_row_limit(compiler: GrammarCompiler, smollm2: LoadedModel) -> None:
    """The draft node passes pruning (llguidance validates it), then its row's mask fails."""
    answer = ids(smollm2, '{"a": {"p1": "x"}}')
    grammar = constraint(compiler, NESTED)
    grammar.commit(answer[:1])
    with pytest.raises(GrammarLimitExceeded) as err:
        grammar.forbidden(answer[1:4])
    check(err.value, 1, "Current row has")


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


class Answer:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def __call__(self, item: Any) -> None:
        self.items.append(item)

    @property
    def tokens(self) -> list[int]:
        return [t for i in self.items if isinstance(i, TextDelta) for t in i.token_ids]


def test_the_limit_ends_only_its_answer(engine: Engine) -> None:
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    wide = GenerationRequest(messages=messages, max_tokens=16, grammar=JsonSchema(NESTED))
    plain = GenerationRequest(messages=messages, max_tokens=16, grammar=JsonSchema())
    alone = Answer()
    engine.submit(plain, alone)
    assert engine.wait_idle(120)
    failing, other = Answer(), Answer()
    engine.submit(wide, failing)
    engine.submit(plain, other)
    assert engine.wait_idle(120)
    assert failing.items[-1] is END
    error = failing.items[-2]
    assert isinstance(error, GrammarLimitExceeded)
    assert 0 < error.tokens == len(failing.tokens)  # the tokens sent before it
    assert other.items[-1] is END and isinstance(other.items[-2], GenerationStats)
    assert other.tokens == alone.tokens
