"""Routing keys: stable over a conversation's turns, distinct between conversations."""

from __future__ import annotations

import json
from typing import Any

from gateway.call import Call
from gateway.front_door import CHAT
from gateway.routes.completions import parse_request
from gateway.routing.key import routing_key


async def _call(messages: list[dict[str, str]]) -> Call:
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    data, request = await parse_request(CHAT, raw, 64)
    unused: dict[str, Any] = {"wait": None, "timing": None}  # not read by routing_key
    return Call("chat", "t", raw, data, request, [], [], **unused)


SYSTEM = {"role": "system", "content": "You edit code."}


async def test_every_turn_of_a_conversation_has_the_first_turns_key() -> None:
    turn1 = [SYSTEM, {"role": "user", "content": "Fix util.py: def f(): pass"}]
    turn2 = [*turn1, {"role": "assistant", "content": "done"}, {"role": "user", "content": "and g"}]
    assert routing_key(await _call(turn1), None, 512) == routing_key(await _call(turn2), None, 512)


async def test_conversations_with_different_openings_differ() -> None:
    a = [SYSTEM, {"role": "user", "content": "Fix util.py"}]
    b = [SYSTEM, {"role": "user", "content": "Fix api.py"}]
    assert routing_key(await _call(a), None, 512) != routing_key(await _call(b), None, 512)


async def test_the_key_is_cut_to_prefix_chars_and_a_session_wins() -> None:
    long = [{"role": "system", "content": "x" * 1000}, {"role": "user", "content": "a"}]
    other = [{"role": "system", "content": "x" * 1000}, {"role": "user", "content": "b"}]
    assert routing_key(await _call(long), None, 64) == routing_key(await _call(other), None, 64)
    assert len(routing_key(await _call(long), None, 64)) == len("chat:") + 64
    assert routing_key(await _call(long), b"s1", 64) == "session:s1"
