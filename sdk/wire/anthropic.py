"""Anthropic Messages API wire types (``POST /v1/messages``, ``/v1/messages/count_tokens``).

The request side reads what Anthropic's clients send; objects are open (``extra="allow"``)
because clients send beta fields this subset does not name (Claude Code sends
``context_management``, ``output_config`` and others on every request). Content blocks are
a tagged union on ``type``: a block type not listed here is a validation error naming it.
The answer side (the message, its stream events, errors) is what the gateway sends, built
and checked with the same types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    """Base for Messages wire objects: unknown fields are kept."""

    model_config = ConfigDict(extra="allow")


# -- request content blocks ---------------------------------------------------------------


class TextBlock(_Open):
    type: Literal["text"] = "text"
    text: str


class ImageBlock(_Open):
    """An image: ``source`` is ``{"type": "base64", "media_type", "data"}``,
    ``{"type": "url", "url"}`` or ``{"type": "file", "file_id"}``."""

    type: Literal["image"] = "image"
    source: dict[str, Any]


class DocumentBlock(_Open):
    """A document: ``source`` is plain text (``{"type": "text", "data"}``), a PDF, a URL,
    a file id or content blocks."""

    type: Literal["document"] = "document"
    source: dict[str, Any]
    title: str | None = None


class ToolUseBlock(_Open):
    """A tool call the assistant made (in a request's history, or in an answer)."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ToolResultContent = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(_Open):
    """A tool's output, sent back in a user message."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | list[ToolResultContent] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Open):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Open):
    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class InputMessage(_Open):
    """One turn; ``system`` turns may appear anywhere (Claude Code sends one mid-conversation)."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class ToolDefinition(_Open):
    """A tool the model may call: a client tool has ``input_schema`` (``type`` absent or
    ``custom``); Anthropic's server tools (``web_search_20250305``, ...) have a ``type``."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(_Open):
    user_id: str | None = None


class _Prompt(_Open):
    """What a request and a token count share: the model and everything it reads."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(_Prompt):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None


class CountTokensRequest(_Prompt):
    """``POST /v1/messages/count_tokens``."""


class TokenCount(_Open):
    """``/v1/messages/count_tokens``'s answer."""

    input_tokens: int


# -- the answer -----------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"]


class MessagesUsage(_Open):
    """Token counts: ``input_tokens`` excludes the prompt tokens read from a cache
    (``cache_read_input_tokens``); the prompt is their sum."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = 0
    cache_read_input_tokens: int | None = 0


AnswerBlock = Annotated[TextBlock | ToolUseBlock, Field(discriminator="type")]


class MessagesResponse(_Open):
    """A whole answer (``type: "message"``)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[AnswerBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessagesUsage


class MessagesErrorDetail(_Open):
    type: str
    message: str


class MessagesError(_Open):
    """An error body: ``{"type": "error", "error": {"type", "message"}}`` (also the
    ``error`` event of a stream)."""

    type: Literal["error"] = "error"
    error: MessagesErrorDetail


# -- stream events (``event: <type>`` lines, each with its object as ``data``) --------------


class MessageStart(_Open):
    type: Literal["message_start"] = "message_start"
    message: MessagesResponse


class ContentBlockStart(_Open):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: AnswerBlock


class TextDelta(_Open):
    type: Literal["text_delta"] = "text_delta"
    text: str


class InputJSONDelta(_Open):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ContentBlockDelta(_Open):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: Annotated[TextDelta | InputJSONDelta, Field(discriminator="type")]


class ContentBlockStop(_Open):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDeltaBody(_Open):
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None


class MessageDelta(_Open):
    """The end of the answer: why it stopped and the final (cumulative) usage."""

    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: MessagesUsage


class MessageStop(_Open):
    type: Literal["message_stop"] = "message_stop"


class Ping(_Open):
    type: Literal["ping"] = "ping"


StreamEvent = Annotated[
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | Ping
    | MessagesError,
    Field(discriminator="type"),
]
