"""Drafts from the file an agent read, through the forms its edit takes, with the real
SmolLM2 tokenizer and engine: the drafter copies an ``Edit`` call's JSON-escaped strings,
an ``apply_patch`` patch inside ``exec_command``'s JSON and a ``Write``'s whole file, where
the prompt's numbered listing alone drafts little; and drafted answers equal plain ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

import lookup.tracks
from local_verifier.engine import GenerationRequest, GenerationStats, TextDelta
from lookup.agent_sources import conversation_documents
from lookup.draft import Source
from lookup.drafter import Drafter
from lookup.index import build_index

PATH = "/repo/lookup/tracks.py"
FILE = Path(lookup.tracks.__file__).read_text()  # a real module of this repository
LINES = FILE.split("\n")[:-1]
REGION = LINES[40:70]  # Track.anchor
RENAMED = [line.replace("positions", "starts") for line in REGION]


def listing(lines: list[str]) -> str:
    return "".join(f"{n:6d}\t{line}\n" for n, line in enumerate(lines, 1))


def messages() -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a coding agent. Call tools with JSON."},
        {"role": "user", "content": "In tracks.py, rename positions to starts in anchor."},
        {"role": "assistant", "content": json.dumps({"name": "Read", "arguments": {"p": PATH}})},
        {"role": "tool", "content": listing(LINES)},
    ]


def patch_call() -> str:
    patch = "*** Begin Patch\n*** Update File: lookup/tracks.py\n@@\n"
    patch += "".join(f"-{line}\n" for line in REGION) + "".join(f"+{line}\n" for line in RENAMED)
    cmd = f"apply_patch <<'EOF'\n{patch}*** End Patch\nEOF\n"
    return json.dumps({"name": "exec_command", "arguments": {"cmd": cmd}})


ANSWERS = {
    "edit": json.dumps(
        {
            "name": "Edit",
            "arguments": {
                "file_path": PATH,
                "old_string": "\n".join(REGION),
                "new_string": "\n".join(RENAMED),
            },
        }
    ),
    "patch": patch_call(),
    "write": json.dumps({"name": "Write", "arguments": {"file_path": PATH, "content": FILE}}),
}


def steps_to_write(drafter: Drafter, answer: list[int], k: int = 16) -> int:
    """Greedy verification steps to commit ``answer``: each step keeps the draft's longest
    prefix that agrees with it, then the target's own next token."""
    steps = i = 0
    while i < len(answer):
        draft = drafter.propose(k).tokens.tolist()
        n = 0
        while n < len(draft) and i + n < len(answer) and draft[n] == answer[i + n]:
            n += 1
        commit = answer[i : i + n + 1]
        drafter.extend(commit)
        i += len(commit)
        steps += 1
    return steps


@pytest.mark.parametrize("shape", list(ANSWERS))
def test_the_conversations_forms_draft_the_edit(smollm2: Any, shape: str) -> None:
    tok = smollm2.tokenizer
    conversation = messages()
    prompt = tok.encode(tok.apply_chat_template(conversation))
    answer = tok.encode(ANSWERS[shape])
    documents = conversation_documents(conversation, tok.encode, tok.fingerprint)
    assert len(documents) == 1
    indexes = [build_index(tokens) for _, tokens in documents]
    alone = steps_to_write(Drafter(prompt), answer)
    agent = steps_to_write(
        Drafter(prompt, documents=indexes, document_sources=[Source.CONVERSATION]), answer
    )
    # the listing's numbers, the escapes and the diff prefixes break the prompt's matches
    # at every line; the conversation's forms carry them through
    assert len(answer) / agent >= 4, (shape, len(answer), agent, alone)
    assert alone >= 2 * agent, (shape, len(answer), agent, alone)


def _generate(engine: Any, req: GenerationRequest) -> tuple[list[int], GenerationStats]:
    items = list(engine.generate(req))
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    return [t for i in items[:-1] if isinstance(i, TextDelta) for t in i.token_ids], stats


@pytest.mark.parametrize("shape", list(ANSWERS))
def test_drafted_answers_to_an_agent_equal_plain_ones(engine: Any, shape: str) -> None:
    """The model continues the edit's beginning (forced in the prompt); its greedy answer
    with the conversation's drafts is the plain answer, token for token."""
    tok = engine.tokenizer
    conversation = messages()
    answer = ANSWERS[shape]
    copied = REGION[4] if shape != "write" else LINES[3]
    begun = answer[: answer.index(json.dumps(copied)[1:-1])]  # its first lines forced
    prompt = tok.encode(tok.apply_chat_template(conversation) + begun)
    documents = conversation_documents(conversation, tok.encode, tok.fingerprint)
    sources = [Source.CONVERSATION] * len(documents)
    plain, _ = _generate(engine, GenerationRequest(prompt_ids=prompt, max_tokens=40, draft=False))
    drafted, stats = _generate(
        engine,
        GenerationRequest(
            prompt_ids=prompt, max_tokens=40, documents=documents, document_sources=sources
        ),
    )
    assert drafted == plain and len(plain) == 40
    assert stats.drafted_by_source.get("conversation", 0) > 0  # the forms were drafted from
    assert np.all(np.asarray(plain) < tok.vocab_size)


@pytest.fixture(scope="module")
def local_url(engine: Any) -> Iterator[str]:
    """The gateway's verifier configuration (one local endpoint) on the shared engine."""
    from gateway.app import create_app
    from gateway.cli.serve import verifier_settings
    from tests.gateway.servers import serve

    with serve(create_app(verifier_settings("smollm2-135m"), engines={"local": engine})) as url:
        yield url


def test_the_local_endpoint_drafts_from_the_listing_the_agent_read(local_url: str) -> None:
    client = openai.OpenAI(base_url=f"{local_url}/v1", api_key="unused", max_retries=0)
    common: dict[str, Any] = {
        "model": "smollm2-135m",
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {
                "role": "user",
                "content": f"Read {PATH} gave:\n{listing(LINES[:30])}\n"
                "Write this file out again without the line numbers.",
            },
        ],
        "temperature": 0,
        "max_tokens": 48,
    }
    plain = client.chat.completions.create(**common, extra_body={"draftgate": {"draft": False}})
    drafted = client.chat.completions.create(**common)
    assert drafted.choices[0].message.content == plain.choices[0].message.content
    stats = (drafted.model_extra or {})["draftgate"]
    assert stats["accepted_by_source"].get("conversation", 0) > 0, stats


def test_remote_verification_drafts_from_the_listing_the_agent_read(smollm2: Any) -> None:
    """The remote-verify endpoint's drafter (``prepare``) has the conversation's forms."""
    from gateway.endpoints.remote.prompt import prepare
    from lookup.index import IndexCache
    from sdk.wire import ChatCompletionRequest

    tok = smollm2.tokenizer
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages()})
    prepared = prepare(request, tok, "", [], [], IndexCache())
    escaped = tok.encode(json.dumps("\n".join(REGION))[1:-1])  # an Edit's old_string
    prepared.drafter.extend(escaped[:40])
    draft = prepared.drafter.propose(8)
    assert draft.tokens.tolist() == escaped[40:48]
    assert set(draft.source.tolist()) == {Source.CONVERSATION}
