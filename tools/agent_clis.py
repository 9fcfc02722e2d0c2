"""Claude Code and Codex CLI against ``draftgate serve``: the agents' own front doors, used
by the real clients.

    python -m tools.agent_clis --cache DIR --json OUT [--local smollm2-135m]

Installs the two CLIs from npm into ``DIR`` (once; pinned versions, :data:`PACKAGES`),
starts a stand-in upstream that plays the model's part (the tests' OpenAI stand-in,
``tests/openai_standin.py``, scripted here) and ``draftgate serve`` in front of it and of
a local endpoint, then runs, each in a fresh workspace and home directory:

- ``one-line``: a one-line prompt; the answer must be the stand-in's text;
- ``read-edit``: "rename ``add`` to ``plus`` in util.py"; the stand-in calls the agent's
  own tools: Claude Code's ``Read`` then ``Edit`` (JSON ``old_string``/``new_string``),
  Codex's ``exec_command`` with ``cat -n`` then with an ``apply_patch`` heredoc; the file
  on disk must be edited and the agent must report the stand-in's closing text;
- ``local``: a one-line prompt on the local endpoint (``--local``, the embedded model by
  default). An agent's system prompt and tools are about 9-20k tokens: on a model whose
  context is smaller the answer is the API's own error naming both numbers, which the
  run records.

Claude Code speaks the Anthropic Messages API (``ANTHROPIC_BASE_URL``, the gateway key as
``ANTHROPIC_API_KEY``, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``); Codex the Responses
API (a ``model_providers`` entry with ``wire_api = "responses"``). Nothing but the npm
install reaches the network; the CLIs talk only to the gateway on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' stand-in, from a checkout

from tests.openai_standin import Script, StandIn  # noqa: E402

PACKAGES = ("@anthropic-ai/claude-code@2.1.197", "@openai/codex@0.171.0")
KEY = "sk-draftgate-agents"
STANDIN_MODEL = "agent-standin"
LOCAL_MODEL = "local-agent"
ONE_LINE = "Say hello in one line."
ONE_LINE_ANSWER = "draftgate answered."
EDIT_PROMPT = "Rename the function add to plus in util.py."
EDITED_ANSWER = "Renamed add to plus in util.py."
SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
Call = tuple[str, dict[str, Any]]


def install(cache: Path) -> dict[str, Path]:
    """The CLIs' executables, installed into ``cache`` by npm unless already there."""
    bins = {
        "claude": cache / "node_modules/.bin/claude",
        "codex": cache / "node_modules/.bin/codex",
    }
    if not all(path.exists() for path in bins.values()):
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache), *PACKAGES],
            check=True,
        )
    return bins


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(body.get("messages") or [])


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {(t.get("function") or {}).get("name", "") for t in body.get("tools") or []}


def _is_edit_task(body: dict[str, Any]) -> bool:
    return any(
        m.get("role") == "user" and "util.py" in json.dumps(m.get("content"))
        for m in _messages(body)
    )


def edit_calls(workspace: Path) -> Callable[[dict[str, Any]], list[Call]]:
    """The stand-in's tool calls for the read-and-edit task: by the agent's tools and the
    tool results the conversation already holds."""
    path = str(workspace / "util.py")

    def calls(body: dict[str, Any]) -> list[Call]:
        if not _is_edit_task(body):
            return []
        done = sum(m.get("role") == "tool" for m in _messages(body))
        tools = _tool_names(body)
        if "Read" in tools and "Edit" in tools:  # Claude Code
            steps: list[Call] = [
                ("Read", {"file_path": path}),
                ("Edit", {"file_path": path, "old_string": "def add(", "new_string": "def plus("}),
            ]
        elif "exec_command" in tools:  # Codex CLI
            patch = (
                "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: util.py\n@@\n"
                "-def add(a, b):\n+def plus(a, b):\n*** End Patch\nEOF\n"
            )
            steps = [("exec_command", {"cmd": "cat -n util.py"}), ("exec_command", {"cmd": patch})]
        else:
            return []
        return [steps[done]] if done < len(steps) else []

    return calls


def reply(body: dict[str, Any]) -> str:
    return EDITED_ANSWER if _is_edit_task(body) else ONE_LINE_ANSWER


@contextmanager
def standin(workspace: Path, port: int) -> Iterator[StandIn]:
    """The scripted upstream on ``port`` for as long as the block runs."""
    app = StandIn(Script(reply=reply, calls=edit_calls(workspace)))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait(f"http://127.0.0.1:{port}/v1/models")
        yield app
    finally:
        server.should_exit = True
        thread.join(10)


def _wait(url: str, deadline_s: float = 120, headers: dict[str, str] | None = None) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # a server in another process starting: polled
    raise RuntimeError(f"{url} did not answer in time")


def gateway_config(standin_port: int, local_model: str) -> str:
    return f"""
[[endpoints]]
name = "standin"
kind = "openai_compatible"
base_url = "http://127.0.0.1:{standin_port}/v1"
models = ["{STANDIN_MODEL}"]

[[endpoints]]
name = "local"
kind = "local"
model = "{local_model}"
models = ["{LOCAL_MODEL}"]

[[keys]]
key_env = "DRAFTGATE_AGENTS_KEY"
tenant = "agents"
"""


@contextmanager
def draftgate_serve(config: Path, port: int, log: Path) -> Iterator[str]:
    """``draftgate serve`` on ``config``, in a process of its own; yields its base URL."""
    env = {**os.environ, "DRAFTGATE_AGENTS_KEY": KEY}
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from gateway.cli import main; main()",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
            ],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            try:
                _wait(f"{url}/healthz")
            except RuntimeError:
                raise RuntimeError(log.read_text()[-3000:]) from None
            yield url
        finally:
            proc.terminate()
            proc.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_claude(
    exe: Path, gateway: str, model: str, prompt: str, workspace: Path, home: Path
) -> dict[str, Any]:
    env = {
        **os.environ,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gateway,
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    command = [
        str(exe),
        "-p",
        prompt,
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        "Read,Edit",
    ]
    return _run(command, env, workspace)


def run_codex(
    exe: Path, gateway: str, model: str, prompt: str, workspace: Path, home: Path
) -> dict[str, Any]:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "draftgate"\n\n'
        "[model_providers.draftgate]\n"
        'name = "draftgate"\n'
        f'base_url = "{gateway}/v1"\n'
        'env_key = "DRAFTGATE_KEY"\n'
        'wire_api = "responses"\n'
    )
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(codex_home), "DRAFTGATE_KEY": KEY}
    command = [
        str(exe), "exec", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox", prompt,
    ]  # fmt: skip
    return _run(command, env, workspace)


def _run(command: list[str], env: dict[str, str], workspace: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,
        )
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        partial = (exc.stdout or b"") + (exc.stderr or b"")
        text = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        code, out = 124, f"timed out: {text}"
    return {"exit_code": code, "seconds": round(time.perf_counter() - t0, 1), "output": out[-2000:]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="npm prefix for the CLIs")
    parser.add_argument("--json", type=Path, required=True, help="where the result goes")
    parser.add_argument("--local", default="smollm2-135m", help="the local endpoint's model")
    args = parser.parse_args(argv)
    bins = install(args.cache)
    result: dict[str, Any] = {"packages": list(PACKAGES), "local_model": args.local, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="draftgate-agents-") as scratch:
        base = Path(scratch)
        standin_port, gateway_port = _free_port(), _free_port()
        config = base / "draftgate.toml"
        config.write_text(gateway_config(standin_port, args.local))
        for agent, runner in (("claude", run_claude), ("codex", run_codex)):
            for case in ("one-line", "read-edit", "local"):
                workspace, home = base / agent / case / "ws", base / agent / case / "home"
                workspace.mkdir(parents=True)
                home.mkdir(parents=True)
                (workspace / "util.py").write_text(SOURCE)
                with (
                    standin(workspace, standin_port) as upstream,
                    draftgate_serve(config, gateway_port, base / f"{agent}-{case}.log") as url,
                ):
                    model = LOCAL_MODEL if case == "local" else STANDIN_MODEL
                    prompt = EDIT_PROMPT if case == "read-edit" else ONE_LINE
                    run = runner(bins[agent], url, model, prompt, workspace, home)
                    run["upstream_requests"] = len(upstream.bodies())
                run["output"] = run["output"].replace(str(base), "<scratch>")
                edited = (workspace / "util.py").read_text()
                expected = EDITED_ANSWER if case == "read-edit" else ONE_LINE_ANSWER
                run["answered"] = expected in run["output"]
                run["file_edited"] = edited == SOURCE.replace("def add(", "def plus(")
                if case == "local":  # the model's answer, or the API's error naming the context
                    out = run["output"]  # the API's message, or Codex's for context_length_exceeded
                    run["context_error"] = (
                        "the model's context is" in out or "context window" in out
                    )
                    run["ok"] = run["exit_code"] == 0 or run["context_error"]
                elif case == "read-edit":
                    run["ok"] = run["exit_code"] == 0 and run["answered"] and run["file_edited"]
                else:
                    run["ok"] = run["exit_code"] == 0 and run["answered"]
                result["runs"][f"{agent}/{case}"] = run
                print(agent, case, {k: v for k, v in run.items() if k != "output"}, flush=True)
        shutil.rmtree(base, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
