"""OpenAI chat/completions wire types (the subset draftgate reads) plus draftgate's extension.

Unknown fields are kept (``extra="allow"``) so a proxy passes them through untouched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Open(BaseModel):
    """Base for wire objects: unknown fields are preserved."""

    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"] = "text"
    text: str


class ChatMessage(_Open):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text, joining text parts."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class Prediction(_Open):
    """OpenAI Predicted Outputs: ``{"type": "content", "content": str | [text parts]}``."""

    type: Literal["content"] = "content"
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class DraftgateOptions(_Open):
    """The ``draftgate`` request extension object."""

    documents: list[str] = Field(default_factory=list, description="document ids to draft from")
    draft: bool = Field(default=True, description="set false to switch drafting off")
    max_draft_tokens: int | None = Field(
        default=None, ge=0, description="cap on draft tokens per verify step (local endpoints)"
    )


class StreamOptions(_Open):
    include_usage: bool = False


Stop = str | list[str] | None


class _SamplingFields(_Open):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: int | None = None
    logprobs: Any = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    draftgate: DraftgateOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: Stop) -> Stop:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    prediction: Prediction | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    audio: Any = None
    modalities: list[str] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None


class PromptTokensDetails(_Open):
    cached_tokens: int = 0


class CompletionTokensDetails(_Open):
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    reasoning_tokens: int = 0


class Usage(_Open):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    completion_tokens_details: CompletionTokensDetails | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class FunctionCall(_Open):
    """A tool call's function: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(_Open):
    """One entry of an assistant message's ``tool_calls``."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(_Open):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Open):
    """A streamed piece of a tool call: the first of a call has its ``index``, ``id``,
    ``type`` and function name; later ones the ``index`` and an arguments fragment."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class AssistantMessage(_Open):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(_Open):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason | None = None
    logprobs: Any = None


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class Delta(_Open):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(_Open):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: Any = None


class ChatCompletionChunk(_Open):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChoice(_Open):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: Any = None


class Completion(_Open):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Open):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "draftgate"


class ModelList(_Open):
    object: Literal["list"] = "list"
    data: list[ModelCard]
