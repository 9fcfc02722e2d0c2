"""llama.cpp beside draftgate on the same prompts and the same weights (optional, not in CI).

    python benchmarks/bench_llamacpp.py --build-dir /tmp/llamacpp [--sdist FILE] \
        [--category code_edit] [--limit 10] [--max-tokens 256] [--threads 2] \
        [--json /tmp/bench_llamacpp.json]

Builds llama.cpp from the source that llama-cpp-python's PyPI sdist vendors (the sdist is
fetched with ``pip download`` unless ``--sdist`` names it; the build is kept in
``--build-dir`` and reused), converts the SmolLM2 GGUF this project serves to F32 with
``llama-quantize --allow-requantize`` (the same dequantized weights draftgate computes with),
then runs, per prompt and interleaved, greedy, ``--max-tokens`` tokens:

- ``llama_plain``: ``llama-completion`` (plain decoding);
- ``llama_lookup``: ``llama-lookup`` (prompt-lookup n-gram drafts, llama.cpp's own mode);
- ``plain``: draftgate's plain decoding;
- ``speculative``: draftgate's engine with the workload's prediction and documents.

Each side's time is its own prompt processing plus decoding (llama.cpp's printed timings;
model loading excluded on both sides). Reported: tokens/s per side, prompt processing
tokens/s, and whether each side's text agrees with draftgate's plain text (the
shorter a prefix of the longer: llama-lookup may overshoot the limit by part of a draft).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from bench_speculative import WORKLOAD, document, run_plain, run_speculative

from local_verifier.engine import Engine, GenerationRequest
from local_verifier.loader import LoadedModel, load_model, smollm2_path

SDIST = "llama-cpp-python==0.3.36"
TARGETS = ("llama-completion", "llama-lookup", "llama-quantize")
SIDES = ("llama_plain", "llama_lookup", "plain", "speculative")


def build(build_dir: Path, sdist: Path | None) -> Path:
    """The directory of the built llama.cpp binaries (built once, then reused)."""
    bin_dir = build_dir / "build" / "bin"
    if all((bin_dir / t).exists() for t in TARGETS):
        return bin_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    if sdist is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", SDIST, "--no-deps", "--no-binary", ":all:"]
            + ["-d", str(build_dir)],
            check=True,
        )
        sdist = next(build_dir.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(build_dir, filter="data")
    source = next(build_dir.glob("llama_cpp_python-*/vendor/llama.cpp"))
    cmake = ["cmake", "-S", str(source), "-B", str(build_dir / "build")]
    subprocess.run(
        cmake
        + ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF"]
        + ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
        check=True,
    )
    subprocess.run(
        ["cmake", "--build", str(build_dir / "build"), "-j", "--target", *TARGETS], check=True
    )
    return bin_dir


def f32_weights(bin_dir: Path, build_dir: Path) -> Path:
    """SmolLM2's GGUF dequantized to F32 by llama.cpp's own quantize tool."""
    out = build_dir / "smollm2-f32.gguf"
    if not out.exists():
        quantize = [str(bin_dir / "llama-quantize"), "--allow-requantize"]
        subprocess.run([*quantize, str(smollm2_path()), str(out), "F32"], check=True)
    return out


def _seconds(pattern: str, log: str) -> tuple[float, int]:
    """(seconds, tokens) of a llama_perf line such as ``prompt eval time = X ms / N tokens``."""
    match = re.search(pattern + r"\s*=\s*([\d.]+) ms /\s*(\d+)", log)
    if match is None:
        raise RuntimeError(f"no {pattern!r} timing in llama.cpp's output:\n{log[-2000:]}")
    return float(match.group(1)) / 1000, int(match.group(2))


def run_llama(
    binary: Path, weights: Path, prompt: Path, limit: int, threads: int, extra: list[str]
) -> dict[str, Any]:
    """One greedy llama.cpp run: its text, prompt seconds, decode seconds and tokens."""
    cmd = [str(binary), "-m", str(weights), "-f", str(prompt), "-n", str(limit), "--temp", "0"]
    cmd += ["-t", str(threads), "-c", "8192", "--no-escape", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    log = done.stderr
    if binary.name == "llama-lookup":
        enc = re.search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        if enc is None or dec is None:
            raise RuntimeError(f"no lookup timings in llama.cpp's output:\n{log[-2000:]}")
        prefill_s, decode_s, tokens = float(enc.group(2)), float(dec.group(2)), int(dec.group(1))
        out, prompt_text = done.stdout.lstrip("\n"), prompt.read_text()
        text = out[len(prompt_text) :] if out.startswith(prompt_text) else out
    else:
        prefill_s, _ = _seconds("prompt eval time", log)
        decode_s, runs = _seconds(r"(?<!prompt )eval time", log)
        tokens = runs + 1  # the first token comes from the prompt pass
        text = done.stdout.removesuffix("\n").removesuffix(" [end of text]")
    return {
        "text": text.strip(),
        "tokens": tokens,
        "prefill_s": prefill_s,
        "wall": prefill_s + decode_s,
    }


def _same(text: str, reference: str) -> bool:
    """Whether ``text`` agrees with ``reference`` (llama-lookup may run past the token limit
    by part of a draft, so the shorter text must be a prefix of the longer one)."""
    return bool(text and reference) and (text.startswith(reference) or reference.startswith(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--sdist", type=Path, default=None, help="llama-cpp-python sdist file")
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--category", default="code_edit")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    bin_dir = build(args.build_dir, args.sdist)
    weights = f32_weights(bin_dir, args.build_dir)
    lm: LoadedModel = load_model(args.model)
    engine = Engine(lm)
    records = [json.loads(x) for x in args.workload.read_text().splitlines() if x.strip()]
    records = [r for r in records if r["category"] == args.category][: args.limit]
    prompt_file = args.build_dir / "prompt.txt"
    rows = []
    for n, record in enumerate(records):
        text = lm.tokenizer.apply_chat_template(record["messages"])
        ids = lm.tokenizer.encode(text)
        prompt_file.write_text(text)
        limit = min(args.max_tokens, record.get("max_tokens") or args.max_tokens)
        req = GenerationRequest(
            prompt_ids=ids,
            max_tokens=limit,
            prediction=record.get("prediction"),
            documents=[document(lm, d["text"]) for d in record.get("documents") or []],
        )
        runs: dict[str, dict[str, Any]] = {}
        for side in SIDES if n % 2 == 0 else SIDES[::-1]:  # alternate to spread drift
            if side == "plain":
                runs[side] = run_plain(lm, ids, limit)
            elif side == "speculative":
                runs[side] = run_speculative(engine, req)
            else:
                binary = bin_dir / (
                    "llama-lookup" if side == "llama_lookup" else "llama-completion"
                )
                extra = ["--spec-draft-n-max", "16"] if side == "llama_lookup" else ["-no-cnv"]
                extra += [] if side == "llama_lookup" else ["--no-display-prompt", "--no-warmup"]
                runs[side] = run_llama(binary, weights, prompt_file, limit, args.threads, extra)
        for side in ("plain", "speculative"):
            runs[side]["tokens"] = len(runs[side]["ids"])
        reference = runs["plain"]["text"].strip()
        row = {
            "id": record["id"],
            "prompt_tokens": len(ids),
            "tokens": {s: runs[s]["tokens"] for s in SIDES},
            "tps": {s: round(runs[s]["tokens"] / runs[s]["wall"], 2) for s in SIDES},
            "prefill_tps": {s: round(len(ids) / runs[s]["prefill"], 1) for s in ("plain",)}
            | {s: round(len(ids) / runs[s]["prefill_s"], 1) for s in ("llama_plain",)},
            "identical_to_plain": {s: _same(runs[s]["text"].strip(), reference) for s in SIDES},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {
        "tps": {
            s: round(
                sum(r["tokens"][s] for r in rows) / sum(r["tokens"][s] / r["tps"][s] for r in rows),
                2,
            )
            for s in SIDES
        },
        "prefill_tps_median": {
            s: statistics.median(r["prefill_tps"][s] for r in rows)
            for s in ("plain", "llama_plain")
        },
        "identical_to_plain": {s: sum(r["identical_to_plain"][s] for r in rows) for s in SIDES},
        "prompts": len(rows),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "prompts": rows}, indent=1))


if __name__ == "__main__":
    main()
