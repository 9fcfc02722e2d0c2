"""OpenAI Responses API wire types (the subset draftgate reads and writes).

Requests: :class:`ResponsesRequest` with its input items (a message, a function or
custom tool call and its output, a reasoning item). Answers: :class:`Response` with its
output items, the stream's events, and the list ``GET /v1/responses/{id}/input_items``
returns. Unknown fields are kept (``extra="allow"``) so a body relayed to a provider that
speaks the API itself goes through untouched.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from sdk.wire.chat import DraftgateOptions


class _Open(BaseModel):
    """Base for wire objects: unknown fields are preserved."""

    model_config = ConfigDict(extra="allow")


# -- content parts -------------------------------------------------------------------


class InputText(_Open):
    type: Literal["input_text"] = "input_text"
    text: str


class OutputText(_Open):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class Refusal(_Open):
    type: Literal["refusal"] = "refusal"
    refusal: str


class InputImage(_Open):
    type: Literal["input_image"] = "input_image"
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputFile(_Open):
    type: Literal["input_file"] = "input_file"


ContentPart = Annotated[
    InputText | OutputText | Refusal | InputImage | InputFile, Field(discriminator="type")
]
Status = Literal["in_progress", "completed", "incomplete"]


# -- items -----------------------------------------------------------------------------


class MessageItem(_Open):
    """A message of the conversation (``type`` may be left out, as OpenAI allows)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: Status | None = None

    def text(self) -> str:
        """The message's text: its string, or its text and refusal parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            p.refusal if isinstance(p, Refusal) else getattr(p, "text", "") for p in self.content
        )


class FunctionCallItem(_Open):
    type: Literal["function_call"] = "function_call"
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: Status | None = None
    namespace: str | None = None


class FunctionCallOutputItem(_Open):
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = None
    status: Status | None = None


class CustomToolCallItem(_Open):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str
    id: str | None = None
    status: Status | None = None
    namespace: str | None = None


class CustomToolCallOutputItem(_Open):
    type: Literal["custom_tool_call_output"] = "custom_tool_call_output"
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = None
    status: Status | None = None


class ReasoningItem(_Open):
    """A model's reasoning (its summary, or content encrypted for the provider that made it)."""

    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    encrypted_content: str | None = None


def _item_type(value: Any) -> str | None:
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else None
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]
OutputItem = MessageItem | FunctionCallItem | CustomToolCallItem


# -- tools -----------------------------------------------------------------------------


class FunctionTool(_Open):
    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class GrammarFormat(_Open):
    """A custom tool's input grammar: Lark or a regular expression."""

    type: Literal["grammar"] = "grammar"
    syntax: Literal["lark", "regex"]
    definition: str


class TextFormat(_Open):
    type: Literal["text"] = "text"


class CustomTool(_Open):
    """A tool whose input is free text (``format`` text) or text in a grammar."""

    type: Literal["custom"] = "custom"
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    format: Annotated[TextFormat | GrammarFormat, Field(discriminator="type")] | None = None


# -- the request -------------------------------------------------------------------------


class TextConfig(_Open):
    """``text``: the answer's ``format`` (text, json_object, json_schema) and verbosity."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesRequest(_Open):
    """``POST /v1/responses``."""

    model: str = Field(min_length=1)
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    stream: bool = False
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    client_metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    draftgate: DraftgateOptions | None = None


# -- the answer --------------------------------------------------------------------------


class InputTokensDetails(_Open):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(_Open):
    reasoning_tokens: int = 0


class ResponseUsage(_Open):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class ResponseError(_Open):
    code: str
    message: str


class IncompleteDetails(_Open):
    reason: Literal["max_output_tokens", "content_filter"]


ResponseStatus = Literal["completed", "failed", "in_progress", "incomplete"]


class Response(_Open):
    """A response object (``POST /v1/responses``, ``GET /v1/responses/{id}``)."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: ResponseStatus
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    text: TextConfig = Field(default_factory=lambda: TextConfig(format={"type": "text"}))
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class InputItemList(_Open):
    """``GET /v1/responses/{id}/input_items``: one page of a stored response's input items."""

    object: Literal["list"] = "list"
    data: list[InputItem]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class DeletedResponse(_Open):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


# -- stream events -------------------------------------------------------------------------


class ResponseEvent(_Open):
    """A lifecycle event: ``response.created``, ``.in_progress``, ``.completed``,
    ``.incomplete``, ``.failed``."""

    type: Literal[
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    sequence_number: int
    response: Response


class OutputItemEvent(_Open):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(_Open):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class TextDeltaEvent(_Open):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class TextDoneEvent(_Open):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ArgumentsDeltaEvent(_Open):
    """A function call's arguments or a custom tool call's input, growing."""

    type: Literal["response.function_call_arguments.delta", "response.custom_tool_call_input.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class FunctionArgumentsDoneEvent(_Open):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomInputDoneEvent(_Open):
    type: Literal["response.custom_tool_call_input.done"] = "response.custom_tool_call_input.done"
    sequence_number: int
    item_id: str
    output_index: int
    input: str


class ErrorEvent(_Open):
    """A failure mid-stream; ``response.failed`` follows it."""

    type: Literal["error"] = "error"
    sequence_number: int
    code: str | None = None
    message: str
    param: str | None = None


StreamEvent = (
    ResponseEvent
    | OutputItemEvent
    | ContentPartEvent
    | TextDeltaEvent
    | TextDoneEvent
    | ArgumentsDeltaEvent
    | FunctionArgumentsDoneEvent
    | CustomInputDoneEvent
    | ErrorEvent
)
