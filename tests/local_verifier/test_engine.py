"""Engine behaviour on the tiny random model: drafts never change the output, and stop
conditions, max_tokens and the context end land exactly where plain decoding ends."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from arrivals import together
from spec_drafts import OracleDrafter, PassThrough, make_draft

from local_verifier.engine import END, Engine, Failed, GenerationRequest, GenerationStats, TextDelta
from local_verifier.errors import EngineClosed, PromptTooLong
from local_verifier.loader import LoadedModel
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain

# a step costs 1 ms plus 0.01 ms a row: drafts of likely tokens always pay (the measured
# costs of a tiny model on a shared machine are mostly noise)
LINEAR_COSTS = [1e-3 + 1e-5 * r for r in range(128 + 16 + 1)]
PROMPT = "def add(a, b):\n    return a + b\n\nThe quick brown fox"


@pytest.fixture(scope="module")
def engine(tiny_lm: LoadedModel) -> Engine:
    return Engine(tiny_lm, max_draft=16, row_costs=LINEAR_COSTS, kv_cache_mb=4)


def plain(lm: LoadedModel, ids: list[int], max_tokens: int | None, stop: list[str] = ()):
    items = list(generate_plain(lm, ids, SamplingParams(), max_tokens, list(stop)))
    result = items[-1]
    assert isinstance(result, PlainResult)
    text = "".join(i.text for i in items[:-1] if isinstance(i, TextDelta))
    return result.token_ids, text, result.finish_reason


def run(engine: Engine, req: GenerationRequest, **inject):
    items = list(engine.generate(req, **inject))
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    deltas = [i for i in items[:-1] if isinstance(i, TextDelta)]
    assert len(deltas) == len(items) - 1
    ids = [t for d in deltas for t in d.token_ids]
    return ids, "".join(d.text for d in deltas), stats


def reference(lm: LoadedModel, ids: list[int], n: int) -> list[int]:
    """Plain greedy tokens without any stop (the oracle drafts from these)."""
    return plain(lm, ids, n)[0]


MODES = ["right", "partly", "random", "shifted", "eos", "tree", "long"]


@pytest.mark.parametrize("mode", MODES)
def test_injected_drafts_never_change_greedy_output(
    engine: Engine, tiny_lm: LoadedModel, mode: str
) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    want_ids, want_text, want_finish = plain(tiny_lm, ids, 40)
    eos = min(tiny_lm.tokenizer.eos_ids)
    drafter = OracleDrafter(reference(tiny_lm, ids, 60), tiny_lm.config.vocab_size, mode, eos)
    width = 3 if mode == "tree" else 1
    got_ids, got_text, stats = run(
        engine,
        GenerationRequest(prompt_ids=ids, max_tokens=40),
        drafter=drafter,
        controller=PassThrough(k=8, width=width),
    )
    assert got_ids == want_ids
    assert got_text == want_text
    assert stats.finish_reason == want_finish
    assert stats.completion_tokens == len(want_ids)
    assert stats.drafted_tokens > 0
    if mode in ("right", "long"):
        assert stats.verify_steps < len(want_ids) / 3  # long accepted runs
        assert stats.accepted_by_position[0] > 0
    if mode in ("partly", "tree", "eos"):
        assert stats.accepted_tokens > 0
    if mode == "random":
        assert stats.accepted_tokens < stats.drafted_tokens / 4


def test_stop_string_inside_an_accepted_run(engine: Engine, tiny_lm: LoadedModel) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    full_ids, full_text, _ = plain(tiny_lm, ids, 40)
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 3]
    assert stop.strip(), "the tiny model's text should hold a visible stop string"
    want_ids, want_text, want_finish = plain(tiny_lm, ids, 40, [stop])
    assert want_finish == "stop" and len(want_ids) < len(full_ids)
    drafter = OracleDrafter(full_ids, tiny_lm.config.vocab_size, "right", 0)
    got_ids, got_text, stats = run(
        engine,
        GenerationRequest(prompt_ids=ids, max_tokens=40, stop=[stop]),
        drafter=drafter,
        controller=PassThrough(k=16),
    )
    assert (got_ids, got_text, stats.finish_reason) == (want_ids, want_text, "stop")
    assert stop not in got_text
    assert stats.accepted_tokens + stats.verify_steps + 1 > len(got_ids)  # ended mid-run


def test_eos_inside_an_accepted_run(engine: Engine, tiny_lm: LoadedModel) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    want_ids, want_text, _ = plain(tiny_lm, ids, 20)
    eos = min(tiny_lm.tokenizer.eos_ids)
    # a drafter whose "reference" continues with EOS after 5 right tokens: the target
    # rejects the EOS (it would not emit it), so the output must go on unchanged
    drafter = OracleDrafter(
        want_ids[:5] + [eos] + want_ids[5:], tiny_lm.config.vocab_size, "right", eos
    )
    got_ids, got_text, _ = run(
        engine,
        GenerationRequest(prompt_ids=ids, max_tokens=20),
        drafter=drafter,
        controller=PassThrough(),
    )
    assert (got_ids, got_text) == (want_ids, want_text)


@pytest.mark.parametrize("max_tokens", [1, 2, 8, 9, 17])
def test_max_tokens_at_a_step_boundary(
    engine: Engine, tiny_lm: LoadedModel, max_tokens: int
) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    want_ids, want_text, want_finish = plain(tiny_lm, ids, max_tokens)
    controller = PassThrough(k=8)
    drafter = OracleDrafter(reference(tiny_lm, ids, 40), tiny_lm.config.vocab_size, "long", 0)
    got_ids, got_text, stats = run(
        engine,
        GenerationRequest(prompt_ids=ids, max_tokens=max_tokens),
        drafter=drafter,
        controller=controller,
    )
    assert (got_ids, got_text, stats.finish_reason) == (want_ids, want_text, want_finish)
    assert len(got_ids) <= max_tokens
    # a step never carries more draft tokens than could still be committed
    produced = 1
    for drafted, accepted in controller.observed:
        assert drafted <= max_tokens - produced - 1
        produced += accepted + 1


def test_drafts_longer_than_the_remaining_context(engine: Engine, tiny_lm: LoadedModel) -> None:
    context = engine.context_length
    base = tiny_lm.tokenizer.encode(PROMPT)
    ids = (base * (context // len(base) + 1))[: context - 12]
    want_ids, want_text, want_finish = plain(tiny_lm, ids, None)
    assert want_finish == "length" and len(want_ids) == 12
    drafter = OracleDrafter(want_ids, tiny_lm.config.vocab_size, "long", 0)
    got_ids, got_text, stats = run(
        engine, GenerationRequest(prompt_ids=ids), drafter=drafter, controller=PassThrough(k=16)
    )
    assert (got_ids, got_text, stats.finish_reason) == (want_ids, want_text, "length")
    assert stats.prompt_tokens + stats.completion_tokens == context


class EmptyDrafter(OracleDrafter):
    def propose(self, max_tokens: int, max_width: int = 1):  # type: ignore[no-untyped-def]
        self.calls += 1
        return make_draft([], [])


def test_empty_drafts_are_plain_steps(engine: Engine, tiny_lm: LoadedModel) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    want_ids, want_text, _ = plain(tiny_lm, ids, 12)
    drafter = EmptyDrafter([], tiny_lm.config.vocab_size, "right", 0)
    got_ids, got_text, stats = run(
        engine,
        GenerationRequest(prompt_ids=ids, max_tokens=12),
        drafter=drafter,
        controller=PassThrough(),
    )
    assert (got_ids, got_text) == (want_ids, want_text)
    assert stats.drafted_tokens == 0 and stats.verify_steps == len(want_ids) - 1
    assert drafter.calls == stats.verify_steps - 1  # the last step has no room for a draft


def test_default_drafter_with_prediction_reports_usage(
    engine: Engine, tiny_lm: LoadedModel
) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    want_ids, want_text, _ = plain(tiny_lm, ids, 30)
    prediction = tiny_lm.tokenizer.decode(want_ids[:20])
    doc = np.asarray(want_ids, dtype=np.uint32)
    got_ids, got_text, stats = run(
        engine,
        GenerationRequest(
            prompt_ids=ids, max_tokens=30, prediction=prediction, documents=[("k" * 64, doc)]
        ),
    )
    assert (got_ids, got_text) == (want_ids, want_text)
    assert stats.accepted_prediction_tokens is not None
    assert stats.rejected_prediction_tokens is not None
    assert stats.accepted_prediction_tokens + stats.rejected_prediction_tokens > 0
    assert len(engine.index_cache) == 1
    run(engine, GenerationRequest(prompt_ids=ids, max_tokens=4, documents=[("k" * 64, doc)]))
    assert len(engine.index_cache) == 1  # the repeated document reused its index


def test_chat_messages_and_draft_off(engine: Engine, tiny_lm: LoadedModel) -> None:
    messages = [{"role": "user", "content": "add two numbers"}]
    text = tiny_lm.tokenizer.apply_chat_template(messages)
    ids = tiny_lm.tokenizer.encode(text)
    want_ids, want_text, _ = plain(tiny_lm, ids, 10)
    got_ids, got_text, stats = run(
        engine, GenerationRequest(messages=messages, max_tokens=10, draft=False)
    )
    assert (got_ids, got_text) == (want_ids, want_text)
    assert stats.drafted_tokens == 0 and stats.prompt_tokens == len(ids)


def test_bad_requests_raise_before_yielding(engine: Engine) -> None:
    with pytest.raises(PromptTooLong):
        engine.generate(GenerationRequest(prompt_ids=[5] * engine.context_length))
    with pytest.raises(ValueError):
        engine.generate(GenerationRequest(prompt="x", messages=[{"role": "user", "content": "x"}]))
    with pytest.raises(ValueError):
        engine.generate(GenerationRequest(prompt="x", max_tokens=0))
    with pytest.raises(ValueError):
        engine.generate(GenerationRequest(prompt_ids=[]))


def test_memory_report(engine: Engine) -> None:
    mem = engine.memory()
    assert mem["weights_bytes"] > 0
    assert mem["kv_reserved_bytes"] >= mem["kv_in_use_bytes"] >= 0
    assert mem["index_bytes"] >= 0


def test_sampling_with_a_seed_is_reproducible(engine: Engine, tiny_lm: LoadedModel) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=7)
    first = run(engine, GenerationRequest(prompt_ids=ids, max_tokens=16, params=params))[0]
    second = run(engine, GenerationRequest(prompt_ids=ids, max_tokens=16, params=params))[0]
    assert first == second and len(first) > 0


@pytest.mark.parametrize("cap", [0, 2])
def test_max_draft_caps_the_tokens_verified_per_step(
    engine: Engine, tiny_lm: LoadedModel, cap: int
) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    _, want_text, _ = plain(tiny_lm, ids, 40)
    free = GenerationRequest(prompt_ids=ids, max_tokens=40, prediction=want_text)
    capped = GenerationRequest(prompt_ids=ids, max_tokens=40, prediction=want_text, max_draft=cap)
    _, free_text, free_stats = run(engine, free)
    _, text, stats = run(engine, capped)
    assert text == free_text == want_text
    assert free_stats.drafted_tokens > 2 * free_stats.verify_steps  # uncapped drafts run long
    assert stats.drafted_tokens <= cap * stats.verify_steps
    assert len(stats.accepted_by_position) <= cap


def test_close_ends_the_running_request_and_refuses_more(tiny_lm: LoadedModel) -> None:
    engine = Engine(tiny_lm, max_draft=16, row_costs=LINEAR_COSTS, kv_cache_mb=4)
    ids = tiny_lm.tokenizer.encode(PROMPT)
    items: list[object] = []
    ended = threading.Event()

    def on_item(item: object) -> None:
        items.append(item)
        if isinstance(item, TextDelta) and len(items) == 1:
            engine.close()  # on the engine thread: the loop stops after this step
        if item is END:
            ended.set()

    others = set(threading.enumerate())  # other tests' engines run threads of their own
    with together(engine):  # its thread cannot end before it is seen
        engine.submit(GenerationRequest(prompt_ids=ids, max_tokens=100, draft=False), on_item)
        (thread,) = set(threading.enumerate()) - others
    assert ended.wait(60)
    assert isinstance(items[-2], Failed) and isinstance(items[-2].error, EngineClosed)
    assert items[-1] is END
    assert sum(isinstance(i, TextDelta) for i in items) < 100
    engine.close()  # from another thread: joins the stopped thread
    assert not thread.is_alive()
    with pytest.raises(EngineClosed):
        engine.submit(GenerationRequest(prompt_ids=ids, max_tokens=4), on_item)


EXIT_MID_REQUEST = """
import atexit, sys, threading
from local_verifier.engine import Engine, GenerationRequest, TextDelta
from local_verifier.loader import load_model

lm = load_model(sys.argv[1], device="cpu", dtype="float32")
engine = Engine(lm, max_draft=16, row_costs={costs!r}, kv_cache_mb=4)
# registered before the engine's own hook, so it runs after it (last in, first out)
atexit.register(lambda: print("engine threads at exit:", sum(
    t.name.startswith("dg-engine-") for t in threading.enumerate())))
first = threading.Event()
ids = lm.tokenizer.encode(sys.argv[2])
engine.submit(GenerationRequest(prompt_ids=ids, max_tokens=150, draft=False),
              lambda item: first.set() if isinstance(item, TextDelta) else None)
first.wait(60)
"""


def test_the_interpreter_exits_cleanly_mid_request(tiny_checkpoint: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            EXIT_MID_REQUEST.format(costs=LINEAR_COSTS),
            str(tiny_checkpoint),
            PROMPT,
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "engine threads at exit: 0" in done.stdout
