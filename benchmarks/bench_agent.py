"""Drafts for coding agents: an agent-shaped conversation, the edit in three shapes, drafts
off and on, on the local engine.

    python -m benchmarks.bench_agent --json agent.json [--model gemma3-270m] \
        [--file lookup/drafter.py] [--lines 300] [--max-tokens 512] [--repeats 2] [--smoke]

The conversation, as a coding agent sends it: a system prompt and a tool list of 12 tools
with their JSON schemas (written here, about 3,900 tokens together), the user's task (a
comment at the top of each method), the assistant's ``Read`` call, and its result: the
first ``--lines`` lines of ``--file`` (a module of this repository) as Claude Code numbers
them (``N\\t<line>``). For ``edit`` and ``patch`` the conversation also holds the agent's
first edit of the task in the same shape (ten lines around an earlier method's signature)
and its one-line result, as an agent's conversation does after its first change. The
chat template renders it (Gemma's alternates user and model turns: a tool call is the
model's text, a tool result a user turn).

What is forced: a 270M model does not reliably choose to write an edit, so the model's
turn starts with the beginning of the tool call already written (appended to the
prompt) and the model continues it: the call's opening and the first ``--forced-lines``
lines of the text it repeats, in that shape's form. Everything after that is the
model's own greedy output, the same in every configuration. The shapes:

- ``edit``: an ``Edit`` call, ``{"name": "Edit", "arguments": {"file_path": ..,
  "old_string": "`` then the region's first lines JSON-escaped (the region starts at the
  first method past 40% of the listing);
- ``patch``: an ``exec_command`` call whose ``cmd`` runs ``apply_patch <<'EOF'`` with
  ``*** Begin Patch`` / ``*** Update File:`` / ``@@`` and the region's first lines as
  context lines (a leading space), all JSON-escaped;
- ``write``: a ``Write`` call whose ``content`` starts with the file's first lines,
  JSON-escaped (a whole-file rewrite).

Configurations, per shape, interleaved, ``--repeats`` times, after a warm-up that puts
the shared prompt in the prefix cache (so every run finds the same cached prefix):
``plain`` (no drafts), ``prompt`` (drafts from the prompt and output only: the
drafter without conversation sources) and ``agent`` (drafts with the conversation's
files in the forms edits write them, ``lookup.agent_sources``, as the gateway's local and
remote-verify endpoints attach them). ``identical`` compares the token ids of all three;
tokens/s = output tokens over the whole generation call; ``ratio`` = agent / plain.

What a 270M model writes after the forced lines is its own: it may stop copying the
file. ``intended_answer`` counts, without the model, what drafting gives one that writes
the edit the task asks for (the comment under the method's head, ``IDEAL_LINES`` lines of
the region repeated; for ``write`` the whole file with the comment under every one-line
``def``): the verify steps that commit those tokens with ``IDEAL_DRAFT``-token chains from
the ``prompt`` drafter and from the ``agent`` one, and the tokens per step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import ROOT, parse, steps, write_json
from local_verifier.engine import Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.loader import LoadedModel, load_model
from lookup.agent_sources import conversation_documents
from lookup.draft import Source
from lookup.drafter import Drafter
from lookup.index import build_index

SMOKE = ("--lines", "30", "--tools", "2", "--max-tokens", "12", "--repeats", "1", "--threads", "1")
SHAPES = ("edit", "patch", "write")
CONFIGS = ("plain", "prompt", "agent")
REPO = "/home/dev/draftgate"  # where the conversation says the repository is
IDEAL_LINES = 40  # lines of the region an intended edit repeats
IDEAL_DRAFT = 16  # draft tokens per step in the intended answers' count

SYSTEM = """You are a coding agent working in a user's software repository from a terminal.
You help with software engineering tasks: fixing bugs, adding features, refactoring,
explaining code, writing tests and reviewing changes. You act through the tools listed
below; every action you take on the user's machine is a tool call.

# How to work
- Read before you write. Open the files you are about to change with Read, and look at
  their callers with Grep before changing a function's signature.
- Keep changes minimal and in the style of the surrounding code: the same naming, the same
  formatting, the same error handling. Do not reformat code you are not changing.
- Prefer Edit for changes to part of a file: old_string must match the file exactly,
  including indentation, and must be unique in the file; include enough surrounding lines
  to make it unique. Use Write only for new files or when most of a file changes.
- In a shell, use exec_command. Edit files with apply_patch through exec_command when a
  change spans several places in one file: a patch names the file with
  "*** Update File: PATH", each hunk starts with "@@" and lists context lines with a
  leading space, removed lines with "-" and added lines with "+".
- After a change, run the project's tests that cover it, and its linters when it has them.
  Report failures honestly; never claim a test passed when you did not run it.
- Never commit, push, or rewrite version control history unless the user asks you to.
- Do not add comments that narrate the change; comments state what the code does and why.

# Safety
- Never print, log or commit credentials, tokens or keys, even when a file contains them.
- Refuse to write code whose purpose is to harm systems or people.
- Ask before deleting files or running commands that change state outside the repository.

# Answers
- Be concise. Lead with the answer or the action; no preamble, no summary of what you are
  about to do. When you finish a task, say in one or two sentences what changed.
- Refer to code as path:line so the user can jump to it.
- When you are unsure what the user wants, ask one precise question instead of guessing.

# Tool calls
Call a tool by answering with one JSON object and nothing else:
{"name": "<tool name>", "arguments": {<arguments matching the tool's schema>}}
The tool's result comes back in the next user turn.

# Environment
Working directory: /home/dev/draftgate
Platform: linux
Shell: bash
The repository is a git repository; its default branch is main.
"""


def _tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


def _s(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def _i(description: str) -> dict[str, str]:
    return {"type": "integer", "description": description}


TOOLS = [
    _tool(
        "Read",
        "Reads a file from the local filesystem. file_path must be absolute. By default up to "
        "2000 lines are read from the start of the file; offset and limit select a range of a "
        "long file. Lines longer than 2000 characters are cut. The result lists the lines "
        "numbered as cat -n does: the line number, a tab, the line. Read images and PDFs as "
        "well; a directory cannot be read (use exec_command with ls). Read several files at "
        "once when you will need them all.",
        {
            "file_path": _s("The absolute path of the file to read"),
            "offset": _i("The line number to start reading from (1-based)"),
            "limit": _i("The number of lines to read"),
        },
        ["file_path"],
    ),
    _tool(
        "Edit",
        "Performs an exact string replacement in a file. Read the file first: an edit of a "
        "file not read in this conversation fails. old_string must match the file's text "
        "exactly, with its indentation, and without the line-number prefix of Read's output "
        "(everything after the tab is the line). The edit fails when old_string is not "
        "unique in the file: give more surrounding context, or set replace_all to change "
        "every occurrence (for renaming a variable, say). new_string must differ from "
        "old_string.",
        {
            "file_path": _s("The absolute path of the file to modify"),
            "old_string": _s("The text to replace"),
            "new_string": _s("The text to replace it with"),
            "replace_all": {
                "type": "boolean",
                "default": False,
                "description": "Replace every occurrence of old_string",
            },
        },
        ["file_path", "old_string", "new_string"],
    ),
    _tool(
        "Write",
        "Writes a file to the local filesystem, replacing it if it exists. An existing file "
        "must have been read in this conversation first. Prefer editing existing files; "
        "write new files only when the task needs them, and never write documentation "
        "files unless asked.",
        {
            "file_path": _s("The absolute path of the file to write"),
            "content": _s("The whole content of the file"),
        },
        ["file_path", "content"],
    ),
    _tool(
        "exec_command",
        "Runs a command in a shell in the working directory and returns its output (stdout "
        "and stderr interleaved), its exit code and the wall time. Long output is cut in the "
        "middle. Quote paths that contain spaces. Apply patches with the apply_patch command: "
        "apply_patch <<'EOF' followed by a patch from *** Begin Patch to *** End Patch and "
        "EOF. Prefer rg over grep and find for searching. Commands that wait for input fail.",
        {
            "cmd": _s("The command line, run with bash -lc"),
            "workdir": _s("The directory to run it in (default: the working directory)"),
            "timeout_ms": _i("Kill the command after this many milliseconds (default 120000)"),
            "with_escalated_permissions": {
                "type": "boolean",
                "description": "Run outside the sandbox (asks the user first)",
            },
            "justification": _s("Why the command needs escalated permissions"),
        },
        ["cmd"],
    ),
    _tool(
        "Glob",
        "Finds files by name with a glob pattern such as **/*.py or src/**/test_*.ts, in "
        "any size of codebase; returns the matching paths sorted by modification time, "
        "newest first. Use it to find files by name; use Grep to find files by content.",
        {
            "pattern": _s("The glob pattern to match files against"),
            "path": _s("The directory to search in (default: the working directory)"),
        },
        ["pattern"],
    ),
    _tool(
        "Grep",
        "Searches file contents with a regular expression (ripgrep syntax), optionally "
        "restricted by a glob or a file type. output_mode content shows the matching lines "
        "(with -n their numbers and -A/-B/-C lines of context), files_with_matches only the "
        "paths (the default), count the number of matches per file. Literal braces need "
        "escaping. Use multiline for patterns that span lines.",
        {
            "pattern": _s("The regular expression to search for"),
            "path": _s("The file or directory to search in"),
            "glob": _s("Only files matching this glob, e.g. *.py"),
            "type": _s("Only files of this type, e.g. py, js, rust"),
            "output_mode": {
                "type": "string",
                "enum": ["content", "files_with_matches", "count"],
                "description": "What to show",
            },
            "-n": {"type": "boolean", "description": "Show line numbers"},
            "-i": {"type": "boolean", "description": "Case-insensitive search"},
            "-A": _i("Lines of context after each match"),
            "-B": _i("Lines of context before each match"),
            "-C": _i("Lines of context around each match"),
            "multiline": {"type": "boolean", "description": "Let . match newlines"},
            "head_limit": _i("Show only the first N results"),
        },
        ["pattern"],
    ),
    _tool(
        "LS",
        "Lists the files and directories in a directory (absolute path), with optional "
        "glob patterns to leave out. Prefer Glob and Grep when you know what you look for.",
        {
            "path": _s("The absolute path of the directory to list"),
            "ignore": {"type": "array", "items": {"type": "string"}, "description": "Globs"},
        },
        ["path"],
    ),
    _tool(
        "TodoWrite",
        "Creates and updates a structured task list for the current session, which the "
        "user sees. Use it for tasks of three steps or more: write every step when you "
        "start, mark exactly one in_progress at a time, and mark each completed as soon as "
        "it is done (not in batches). Do not use it for a single simple change.",
        {
            "todos": {
                "type": "array",
                "description": "The whole updated list",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": _s("What the step does, imperative"),
                        "status": {
                            "type": "string",
                            "enum": ["pending", "in_progress", "completed"],
                        },
                        "id": _s("A stable id for the step"),
                    },
                    "required": ["content", "status", "id"],
                },
            }
        },
        ["todos"],
    ),
    _tool(
        "WebFetch",
        "Fetches a URL and answers a question about its content with a small fast model. "
        "HTTP is upgraded to HTTPS; a redirect to another host is reported instead of "
        "followed (fetch the new URL then). Results are cached for 15 minutes. Read-only: "
        "it never changes anything.",
        {
            "url": {"type": "string", "format": "uri", "description": "The URL to fetch"},
            "prompt": _s("What to find out from the page"),
        },
        ["url", "prompt"],
    ),
    _tool(
        "WebSearch",
        "Searches the web and returns result titles, URLs and snippets, for facts newer than "
        "your training data. Restrict or exclude domains when the user names them. Cite the "
        "URLs you use in your answer.",
        {
            "query": _s("The search query"),
            "allowed_domains": {"type": "array", "items": {"type": "string"}},
            "blocked_domains": {"type": "array", "items": {"type": "string"}},
        },
        ["query"],
    ),
    _tool(
        "NotebookEdit",
        "Replaces, inserts or deletes one cell of a Jupyter notebook (.ipynb). cell_id names "
        "the cell; with edit_mode insert the new cell goes after it (or first when no id is "
        "given); delete removes it.",
        {
            "notebook_path": _s("The absolute path of the notebook"),
            "cell_id": _s("The id of the cell to edit"),
            "new_source": _s("The new source of the cell"),
            "cell_type": {"type": "string", "enum": ["code", "markdown"]},
            "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]},
        },
        ["notebook_path", "new_source"],
    ),
    _tool(
        "Task",
        "Starts a sub-agent with its own context for an open-ended search or a multi-step "
        "task, and returns its final report. Give it a complete, self-contained description: "
        "it does not see this conversation. Run independent sub-agents in parallel.",
        {
            "description": _s("A short (3-5 word) description of the task"),
            "prompt": _s("The task for the agent to perform"),
            "subagent_type": _s("The kind of agent: general-purpose, explorer or reviewer"),
        },
        ["description", "prompt"],
    ),
]


def numbered(lines: list[str]) -> str:
    """A ``Read`` result: each line numbered as ``cat -n`` does (right-aligned, a tab)."""
    return "".join(f"{n:6d}\t{line}\n" for n, line in enumerate(lines, 1))


def region_start(lines: list[str]) -> int:
    """The first method definition past 40% of ``lines`` (the edited region's first line)."""
    start = len(lines) * 2 // 5
    return next((i for i in range(start, len(lines)) if lines[i].startswith("    def ")), start)


def forced(shape: str, path: str, lines: list[str], forced_lines: int) -> str:
    """The beginning of the model's tool call for ``shape`` (see the module docstring): the
    call's JSON up to the end of its first ``forced_lines`` lines of repeated text."""
    start = region_start(lines)
    region = "".join(f"{line}\n" for line in lines[start : start + forced_lines])
    call: dict[str, Any]
    if shape == "edit":
        call = {"name": "Edit", "arguments": {"file_path": path, "old_string": region}}
    elif shape == "patch":
        rel = path.removeprefix(REPO + "/")
        patch = f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {rel}\n@@\n"
        patch += "".join(f" {line}\n" for line in lines[start : start + forced_lines])
        call = {"name": "exec_command", "arguments": {"cmd": patch}}
    elif shape == "write":
        content = "".join(f"{line}\n" for line in lines[:forced_lines])
        call = {"name": "Write", "arguments": {"file_path": path, "content": content}}
    else:
        raise ValueError(f"unknown shape {shape!r}")
    whole = json.dumps(call, ensure_ascii=False)
    return whole[: whole.rindex('"}}')]  # the last string left open


def conversation(path: str, lines: list[str], tools: int) -> list[dict[str, str]]:
    """The agent's conversation up to its first edit (roles as the agent sends them)."""
    name = path.rsplit("/", 1)[-1]
    return [
        {"role": "system", "content": SYSTEM + "\n# Tools\n" + json.dumps(TOOLS[:tools], indent=1)},
        {
            "role": "user",
            "content": f"In {name}, put a comment line under each method's signature and "
            "docstring saying how its cost grows, and keep the code itself as it is.",
        },
        {
            "role": "assistant",
            "content": json.dumps(
                {"name": "Read", "arguments": {"file_path": path, "limit": len(lines)}}
            ),
        },
        {"role": "tool", "content": numbered(lines)},
    ]


COMMENT = "        # Cost: constant."  # the line the task asks for under each method's head


def head_lines(lines: list[str], at: int) -> int:
    """The lines of the method defined at ``at`` that the comment goes under: its signature,
    and its docstring when that is one line."""
    doc = lines[at + 1].strip() if at + 1 < len(lines) else ""
    return 2 if len(doc) > 6 and doc.startswith('"""') and doc.endswith('"""') else 1


def edit_call(shape: str, path: str, old: list[str], head: int) -> str:
    """The ``edit`` or ``patch`` call that puts ``COMMENT`` after the first ``head`` of the
    file's lines ``old``, as the model writes it (JSON)."""
    new = [*old[:head], COMMENT, *old[head:]]
    call: dict[str, Any]
    if shape == "edit":
        text = ["\n".join(old) + "\n", "\n".join(new) + "\n"]
        call = {
            "name": "Edit",
            "arguments": {"file_path": path, "old_string": text[0], "new_string": text[1]},
        }
    else:
        rel = path.removeprefix(REPO + "/")
        hunk = "".join(f" {line}\n" for line in old[:head]) + f"+{COMMENT}\n"
        hunk += "".join(f" {line}\n" for line in old[head:])
        patch = f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {rel}\n@@\n{hunk}"
        call = {"name": "exec_command", "arguments": {"cmd": patch + "*** End Patch\nEOF\n"}}
    return json.dumps(call, ensure_ascii=False)


def earlier_edit(shape: str, path: str, lines: list[str]) -> list[dict[str, str]]:
    """The agent's first edit of the task in ``shape`` (``edit`` and ``patch``), and its
    result: ``COMMENT`` under the head of the last one-line ``def`` before the edited
    region, ten lines of the file around it repeated."""
    start = region_start(lines)
    at = next((i for i in range(start - 1, -1, -1) if lines[i].startswith("    def ")
               and lines[i].endswith(":")), -1)  # fmt: skip
    if shape == "write" or at < 0:
        return []
    call = edit_call(shape, path, lines[at : at + 10], head_lines(lines, at))
    return [
        {"role": "assistant", "content": call},
        {"role": "tool", "content": f"The file {path} has been updated."},
    ]


def intended(shape: str, path: str, lines: list[str]) -> str:
    """The whole call a model that follows the task writes: ``COMMENT`` under the edited
    region's method head, the region's first ``IDEAL_LINES`` lines repeated (``edit``,
    ``patch``), or the whole file with ``COMMENT`` under every one-line ``def`` (``write``)."""
    if shape != "write":
        start = region_start(lines)
        return edit_call(shape, path, lines[start : start + IDEAL_LINES], head_lines(lines, start))
    heads = [
        i for i, line in enumerate(lines) if line.startswith("    def ") and line.endswith(":")
    ]
    after = {i + head_lines(lines, i) - 1 for i in heads}
    content = [
        x for i, line in enumerate(lines) for x in ([line, COMMENT] if i in after else [line])
    ]
    call = {"name": "Write", "arguments": {"file_path": path, "content": "\n".join(content)}}
    return json.dumps(call, ensure_ascii=False)


def steps_to_write(drafter: Drafter, answer: list[int], k: int) -> int:
    """Verify steps that commit ``answer`` when the target writes it: each step keeps the
    longest prefix of the drafter's ``k``-token chain that agrees, then one token more."""
    steps = i = 0
    while i < len(answer):
        draft = drafter.propose(k).tokens.tolist()
        n = 0
        while n < len(draft) and i + n < len(answer) and draft[n] == answer[i + n]:
            n += 1
        drafter.extend(answer[i : i + n + 1])
        i += n + 1
        steps += 1
    return steps


def ideal(prompt: list[int], answer: list[int], shown: list[tuple[str, Any]]) -> dict[str, Any]:
    """Tokens per verify step on the intended answer, drafts from the prompt and output alone
    and with the conversation's forms (no model: what drafting gives a model that copies)."""
    alone = steps_to_write(Drafter(prompt), answer, IDEAL_DRAFT)
    indexes = [build_index(tokens) for _, tokens in shown]
    sources = [Source.CONVERSATION] * len(indexes)
    agent = steps_to_write(Drafter(prompt, documents=indexes, document_sources=sources), answer,
                           IDEAL_DRAFT)  # fmt: skip
    return {
        "tokens": len(answer),
        "draft_tokens": IDEAL_DRAFT,
        "steps": {"prompt": alone, "agent": agent},
        "tokens_per_step": {
            "prompt": round(len(answer) / alone, 2),
            "agent": round(len(answer) / agent, 2),
        },  # fmt: skip
    }


def rendered(lm: LoadedModel, messages: list[dict[str, str]], prefix: str) -> list[int]:
    """The prompt's token ids: the chat template (tool results as user turns), then the
    forced beginning of the model's turn."""
    turns = [{**m, "role": "user"} if m["role"] == "tool" else m for m in messages]
    text = lm.tokenizer.apply_chat_template(turns, add_generation_prompt=True) + prefix
    return lm.tokenizer.encode(text, add_special_tokens=False)


def run(engine: Engine, req: GenerationRequest) -> dict[str, Any]:
    begin = time.perf_counter()
    items = list(engine.generate(req))
    wall = time.perf_counter() - begin
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    deltas = [i for i in items[:-1] if isinstance(i, TextDelta)]
    return {
        "ids": [t for d in deltas for t in d.token_ids],
        "text": "".join(d.text for d in deltas),
        "wall": wall,
        "stats": stats,
    }


def measure(
    lm: LoadedModel, engine: Engine, args: argparse.Namespace, lines: list[str], path: str
) -> dict[str, Any]:
    messages = conversation(path, lines, args.tools)
    tok = lm.tokenizer
    shared = rendered(lm, messages, "")
    engine_run = run(engine, GenerationRequest(prompt_ids=shared, max_tokens=1, draft=False))
    begin = time.perf_counter()
    documents = conversation_documents(messages, tok.encode, tok.fingerprint)
    build_s = time.perf_counter() - begin  # tokenized once; the shapes' calls hit the cache
    shapes: dict[str, Any] = {}
    for shape in steps(args.shapes, "shapes"):
        turns = messages + earlier_edit(shape, path, lines)
        shown = conversation_documents(turns, tok.encode, tok.fingerprint)
        prefix = forced(shape, path, lines, args.forced_lines)
        ids = rendered(lm, turns, prefix)
        base = {"prompt_ids": ids, "max_tokens": args.max_tokens}
        requests = {
            "plain": GenerationRequest(**base, draft=False),
            "prompt": GenerationRequest(**base),
            "agent": GenerationRequest(
                **base,
                documents=shown,
                document_sources=[Source.CONVERSATION] * len(shown),
            ),
        }
        run(engine, GenerationRequest(prompt_ids=ids, max_tokens=1, draft=False))  # warm
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for r in range(args.repeats):
            for config in CONFIGS if r % 2 == 0 else CONFIGS[::-1]:  # alternate against drift
                runs[config].append(run(engine, requests[config]))
        shapes[shape] = summarise(shape, prefix, runs)
        shapes[shape]["prompt_tokens"] = len(ids)
        answer = tok.encode(intended(shape, path, lines))
        shapes[shape]["intended_answer"] = ideal(rendered(lm, turns, ""), answer, shown)
        print(f"{shape:<6} intended answer: {json.dumps(shapes[shape]['intended_answer'])}")
    return {
        "prompt_tokens": len(shared),
        "system_and_tools_tokens": len(tok.encode(messages[0]["content"])),
        "listing_tokens": len(tok.encode(messages[-1]["content"])),
        "conversation_sources": {
            "documents": len(documents),
            "tokens": int(sum(len(t) for _, t in documents)),
            "build_s": round(build_s, 4),
        },
        "first_prefill_s": round(engine_run["stats"].prefill_s, 3),
        "shapes": shapes,
    }


def summarise(shape: str, prefix: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    first = runs["plain"][0]
    identical = all(r["ids"] == first["ids"] and r["text"] == first["text"] for c in CONFIGS
                    for r in runs[c])  # fmt: skip
    tokens = {c: sum(len(r["ids"]) for r in runs[c]) for c in CONFIGS}
    tps = {c: tokens[c] / sum(r["wall"] for r in runs[c]) for c in CONFIGS}
    row: dict[str, Any] = {
        "forced_prefix": prefix[-400:],
        "output_tokens": len(first["ids"]),
        "output_head": first["text"][:400],
        "identical": identical,
        "tok_s": {c: round(v, 2) for c, v in tps.items()},
        "ratio": round(tps["agent"] / tps["plain"], 3),
        "ratio_prompt_only": round(tps["prompt"] / tps["plain"], 3),
    }
    for config in ("prompt", "agent"):
        stats: GenerationStats = runs[config][0]["stats"]
        row[config] = {
            "verify_steps": stats.verify_steps,
            "drafted": stats.drafted_tokens,
            "accepted": stats.accepted_tokens,
            "accepted_by_source": dict(stats.accepted_by_source),
        }
    print(
        f"{shape:<6} {row['output_tokens']:>4} tok  "
        + "  ".join(f"{c} {tps[c]:6.1f}" for c in CONFIGS)
        + f"  agent/plain x{row['ratio']:.2f}  prompt/plain x{row['ratio_prompt_only']:.2f}"
        + f"  identical {identical}",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--file", default="lookup/drafter.py", help="repository file read")
    parser.add_argument("--lines", type=int, default=300, help="its first lines, read")
    parser.add_argument("--forced-lines", type=int, default=4)
    parser.add_argument("--tools", type=int, default=len(TOOLS), help="the first N tools listed")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--kv-cache-mb", type=float, default=1024)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: measured and chosen at load)"
    )
    args = parse(parser, SMOKE)
    lines = (ROOT / args.file).read_text().split("\n")[: args.lines]
    path = f"{REPO}/{args.file}"
    lm = load_model(args.model, tune_threads=not args.threads, kv_cache_mb=args.kv_cache_mb)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(lm, kv_cache_mb=args.kv_cache_mb)
    try:
        result = measure(lm, engine, args, lines, path)
    finally:
        engine.close()
    result = {
        "model": args.model,
        "file": args.file,
        "lines": len(lines),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "tools": args.tools,
        "forced": "the model's turn starts with the tool call's opening and the first "
        f"{args.forced_lines} lines of the repeated text in the shape's form (forced_prefix "
        "per shape); the rest is the model's greedy output. The edit and patch "
        "conversations hold the agent's first edit of the task in the same shape",
        "ratio_goal": 2.0,
        **result,
    }
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
