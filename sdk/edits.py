"""Code edits with predicted outputs: the prompt, the answer's code, the result, safe writes.

The client sends the current code as the ``prediction`` in exactly the shape the answer
is asked for (one fenced block), so an endpoint that accepts predictions (or the
gateway's local verifier) can confirm the unchanged parts instead of generating them.
Edits always stream internally, so ``timings`` has a real time to first token; the
clients' ``edit``/``edit_file`` drive an :class:`EditSession` with the chunks.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sdk.errors import BinaryFileError, EditError, FileTooLargeError, IncompleteEditError
from sdk.files import read_regular_file, text_of
from sdk.languages import language_for
from sdk.wire import ChatCompletionChunk, Usage

DEFAULT_MAX_FILE_BYTES = 1 << 20
"""``edit_file`` refuses files larger than this (1 MiB) unless told otherwise."""
BYTES_PER_TOKEN_ESTIMATE = 3
"""A generous estimate: BPE tokenizers give about 3.5-4 bytes of source code per token."""
HEADROOM_TOKENS = 256
"""Room for a longer edit and for text around the code block."""

SYSTEM_PROMPT = (
    "You edit code. Apply the user's instruction to the code and answer with the complete "
    "modified code in a single fenced code block, with no explanation."
)

PREDICTION_HEADER = "x-draftgate-prediction"
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$")


# ---------------------------------------------------------------- prompt


def fenced(code: str, language: str | None) -> str:
    """``code`` in a fence longer than any fence inside it."""
    longest = max((len(m) for m in re.findall(r"^\s*(`{3,})", code, re.M)), default=2)
    fence = "`" * max(3, longest + 1)
    body = code if code.endswith("\n") or not code else code + "\n"
    return f"{fence}{language or ''}\n{body}{fence}"


def edit_messages(code: str, instruction: str, language: str | None) -> list[dict[str, str]]:
    """The chat messages that ask for the complete modified code in one fenced block."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": f"Instruction: {instruction}\n\nCode:\n{fenced(code, language)}",
        },
    ]


def default_max_tokens(prediction: str) -> int:
    """The answer cap of an edit whose caller set none: twice the code's tokens plus headroom.

    A faithful answer repeats the code once with some changes; one that runs past twice
    its size is looping, and without a cap it would run until the context is full.
    """
    estimate = math.ceil(len(prediction.encode("utf-8")) / BYTES_PER_TOKEN_ESTIMATE)
    return 2 * estimate + HEADROOM_TOKENS


# ---------------------------------------------------------------- reading the answer


@dataclass(frozen=True)
class _Block:
    language: str
    body: str


def _fenced_blocks(text: str) -> list[_Block]:
    """Fenced code blocks in order; an unclosed last fence runs to the end of the text."""
    blocks: list[_Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE_RE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, language = opening.group(1), opening.group(2).lower()
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
        blocks.append(_Block(language, "\n".join(lines[i + 1 : end])))
        i = end + 1
    return blocks


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a.splitlines(), b.splitlines(), autojunk=False).ratio()


def extract_code(answer: str, original: str, language: str | None = None) -> str:
    """The modified code in a model's answer.

    - no fence: the whole answer (without surrounding blank lines);
    - one fence: its body, whatever text stands around it;
    - several: among the blocks tagged with ``language`` (or untagged) if there are any,
      the one most like the original code, passing over a verbatim copy of the original
      when another block is similar too (a "before" block shown next to the "after").

    The result ends with a newline exactly when the original did.
    """
    blocks = _fenced_blocks(answer)
    if not blocks:
        code = answer.strip("\n")
    else:
        tagged = [b for b in blocks if b.language in ("", (language or "").lower())]
        candidates = tagged or blocks
        scored = sorted(candidates, key=lambda b: _similarity(b.body, original), reverse=True)
        best = scored[0]
        if len(scored) > 1 and best.body.strip() == original.strip():
            runner_up = scored[1]
            if _similarity(runner_up.body, original) >= 0.5:
                best = runner_up
        code = best.body.strip("\n")
    if original.endswith("\n") and code:
        code += "\n"
    if "\r\n" in original:
        code = code.replace("\r\n", "\n").replace("\n", "\r\n")
    return code


def unified_diff(before: str, after: str, name: str = "code") -> str:
    """A unified diff (``git apply``-able), marking a missing newline at end of file."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{name}",
        tofile=f"b/{name}",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class EditUsage:
    """Token counts the endpoint reported; prediction counts are None where it gave none."""

    prompt_tokens: int
    completion_tokens: int
    accepted_prediction_tokens: int | None
    rejected_prediction_tokens: int | None

    @classmethod
    def from_wire(cls, usage: Usage) -> EditUsage:
        details = usage.completion_tokens_details
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            accepted_prediction_tokens=details.accepted_prediction_tokens if details else None,
            rejected_prediction_tokens=details.rejected_prediction_tokens if details else None,
        )


@dataclass(frozen=True)
class EditTimings:
    """Client-side timings of the edit request, in seconds from sending it.

    ``ttft_s``: to the first chunk carrying content; ``total_s``: to the end of the stream;
    ``tokens_per_s``: (completion_tokens - 1) / (total_s - ttft_s), None without usage.
    """

    ttft_s: float | None
    total_s: float
    tokens_per_s: float | None


@dataclass(frozen=True)
class EditDelta:
    """A piece of the answer as it streams in (``text`` is the raw answer text)."""

    text: str
    elapsed_s: float


@dataclass(frozen=True)
class EditResult:
    """A finished edit: the new code, its diff against the old, usage, timings, raw answer.

    ``prediction`` is what the gateway did with the prediction (its
    ``X-Draftgate-Prediction`` header: ``passed``, ``dropped:<reason>``,
    ``verified-locally``, ...), None from an endpoint that does not say.
    ``path``/``written``/``backup`` are set by ``edit_file``.
    """

    code: str
    diff: str
    usage: EditUsage | None
    timings: EditTimings
    raw: str
    finish_reason: str | None
    prediction: str | None = None
    path: Path | None = None
    written: bool = False
    backup: Path | None = None

    @property
    def changed(self) -> bool:
        return bool(self.diff)


class EditSession:
    """Builds one edit request and turns its stream of chunks into deltas and a result."""

    def __init__(
        self,
        code: str,
        instruction: str,
        *,
        language: str | None = None,
        name: str = "code",
        sampling: Mapping[str, Any] | None = None,
    ) -> None:
        self.code = code
        self.language = language
        self.name = name
        self.messages = edit_messages(code, instruction, language)
        self.prediction = fenced(code, language)
        self.sampling = {"temperature": 0.0, **(sampling or {})}
        if "max_tokens" not in self.sampling and "max_completion_tokens" not in self.sampling:
            self.sampling["max_tokens"] = default_max_tokens(self.prediction)
        self.sampling["stream_options"] = {"include_usage": True}
        self._parts: list[str] = []
        self._usage: Usage | None = None
        self._finish_reason: str | None = None
        self._started = time.perf_counter()
        self._first_content: float | None = None
        self._prediction_status: str | None = None

    def start(self) -> None:
        """Mark the moment the request is sent."""
        self._started = time.perf_counter()

    def answered(self, headers: Mapping[str, str]) -> None:
        """Note the response headers (what the gateway did with the prediction)."""
        self._prediction_status = headers.get(PREDICTION_HEADER)

    def feed(self, chunk: ChatCompletionChunk) -> EditDelta | None:
        """Take one chunk; the new text it carries, if any."""
        if chunk.usage is not None:
            self._usage = chunk.usage
        text = ""
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            text += choice.delta.content or ""
            self._finish_reason = choice.finish_reason or self._finish_reason
        if not text:
            return None
        now = time.perf_counter()
        if self._first_content is None:
            self._first_content = now
        self._parts.append(text)
        return EditDelta(text=text, elapsed_s=now - self._started)

    def result(self) -> EditResult:
        """The finished edit; raises :class:`IncompleteEditError` unless the answer stopped normally."""
        total = time.perf_counter() - self._started
        raw = "".join(self._parts)
        if self._finish_reason != "stop":
            limit = self.sampling.get("max_tokens") or self.sampling.get("max_completion_tokens")
            raise IncompleteEditError(
                f"the answer ended with finish_reason={self._finish_reason!r} after "
                f"{len(raw)} characters (max_tokens={limit}); raise max_tokens or shorten "
                "the code",
                raw=raw,
                completion_tokens=self._usage.completion_tokens if self._usage else None,
            )
        code = extract_code(raw, self.code, self.language)
        usage = EditUsage.from_wire(self._usage) if self._usage else None
        ttft = None if self._first_content is None else self._first_content - self._started
        rate = None
        if usage and ttft is not None and usage.completion_tokens > 1 and total > ttft:
            rate = (usage.completion_tokens - 1) / (total - ttft)
        return EditResult(
            code=code,
            diff=unified_diff(self.code, code, self.name),
            usage=usage,
            timings=EditTimings(ttft_s=ttft, total_s=total, tokens_per_s=rate),
            raw=raw,
            finish_reason=self._finish_reason,
            prediction=self._prediction_status,
        )


# ---------------------------------------------------------------- files


def read_source(path: Path, max_bytes: int) -> str:
    """A regular text file's contents, refusing links, FIFOs, binaries and files over ``max_bytes``."""
    text = text_of(read_regular_file(path, max_bytes))
    if text is None:
        raise BinaryFileError(
            f"{path}: looks binary (a NUL byte or not UTF-8); only text is edited"
        )
    return text


def write_atomic(path: Path, text: str, *, expected: str, backup: bool) -> Path | None:
    """Replace ``path`` with ``text`` atomically; keep ``path.bak`` first when ``backup``.

    The new content goes to a temporary file in the same directory, is fsynced, gets the
    old file's permissions and is renamed over the old file, so a reader sees the old or
    the new file, never a mix. The backup is written the same way (a rename replaces a
    ``.bak`` symlink instead of writing through it). Refuses when the file is no longer a
    regular file holding ``expected`` (it changed while the edit ran). Returns the
    backup's path.
    """
    old = expected.encode("utf-8")
    try:
        unchanged = read_regular_file(path, len(old)) == old
    except FileTooLargeError:
        unchanged = False
    if not unchanged:
        raise EditError(f"{path} changed on disk while the edit ran; nothing written")
    new = text.encode("utf-8")
    mode = stat.S_IMODE(path.stat().st_mode)
    backup_path = path.with_name(path.name + ".bak") if backup else None
    if backup_path is not None:
        _replace_with(backup_path, old, mode)
    _replace_with(path, new, mode)
    _fsync_dir(path.parent)
    return backup_path


def _replace_with(path: Path, data: bytes, mode: int) -> None:
    """Put ``data`` at ``path`` by writing a fresh temporary file and renaming it over ``path``."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class FileEdit:
    """What ``edit_file`` needs besides the request: where the code came from and how to write."""

    path: Path
    source: str
    dry_run: bool
    backup: bool

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, max_bytes: int, dry_run: bool, backup: bool
    ) -> FileEdit:
        p = Path(path)
        return cls(path=p, source=read_source(p, max_bytes), dry_run=dry_run, backup=backup)

    def session(
        self, instruction: str, language: str | None, sampling: Mapping[str, Any]
    ) -> EditSession:
        """The edit request for this file (language from the extension unless given)."""
        return EditSession(
            self.source,
            instruction,
            language=language or language_for(self.path),
            name=self.path.name,
            sampling=sampling,
        )

    def finish(self, result: EditResult) -> EditResult:
        """Write the edit (unless a dry run or unchanged) and note what happened."""
        if self.dry_run or not result.changed:
            return replace(result, path=self.path)
        backup = write_atomic(self.path, result.code, expected=self.source, backup=self.backup)
        return replace(result, path=self.path, written=True, backup=backup)
