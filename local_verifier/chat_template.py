"""Chat templates rendered in a sandboxed jinja2 environment, as transformers renders them."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """Accepts ``{% generation %}...{% endgeneration %}`` blocks and renders their body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template (cached per source text)."""
    return _environment().from_string(source)


@lru_cache(maxsize=16)
def uses_tools(source: str) -> bool:
    """Whether a chat template reads the ``tools`` variable (can show tools to the model)."""
    env = _environment()
    return "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    special_tokens: dict[str, str],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """Render ``messages`` with the variables transformers passes (special tokens by name)."""
    for message in messages:
        if not isinstance(message, dict):
            raise TypeError(f"chat messages must be dicts, got {message!r}")
    try:
        return compile_template(source).render(
            **special_tokens,
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
        )
    except jinja2.TemplateError as exc:  # raise_exception and messages the template cannot show
        raise ValueError(f"messages: the model's chat template refused them: {exc}") from None
