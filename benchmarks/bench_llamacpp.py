"""llama.cpp beside draftgate on the same prompts and the same weights (optional, not in CI).

    python -m benchmarks.bench_llamacpp --build-dir /tmp/llamacpp [--sdist FILE] \
        [--category code_edit] [--limit 10] [--max-tokens 256] [--threads 2] \
        [--dtype bf16] [--llama-quant Q4_1,Q8_0,F32] [--gguf FILE] [--prefill 1024,4096,8192] \
        [--llama-repack] [--llama-no-amx] [--json /tmp/bench_llamacpp.json] [--smoke]

Builds llama.cpp from the source that llama-cpp-python's PyPI sdist vendors (the sdist is
fetched with ``pip download`` unless ``--sdist`` names it; the build is kept in
``--build-dir`` and reused), converts the SmolLM2 GGUF this project serves to each of
``--llama-quant`` with ``llama-quantize --allow-requantize`` (F32 by default: the same
dequantized weights draftgate computes with), then runs, per prompt and interleaved,
greedy, ``--max-tokens`` tokens:

- ``llama_plain``: ``llama-completion`` (plain decoding) on the first ``--llama-quant``;
- ``llama_lookup``: ``llama-lookup`` (prompt-lookup n-gram drafts, llama.cpp's own mode)
  on the first ``--llama-quant``;
- ``llama_plain_<quant>``: ``llama-completion`` on each further ``--llama-quant``;
- ``plain``: draftgate's plain decoding (``--dtype``: float32, or the bf16 target);
- ``speculative``: draftgate's engine with the workload's prediction and documents.

Each side's time is its own prompt processing plus decoding (llama.cpp's printed timings;
model loading excluded on both sides; both on ``--threads`` threads). llama.cpp runs with ``--no-repack`` unless
``--llama-repack``: its repacked quantized weights take its AMX int8 path, which dies with
SIGILL/SIGSEGV on the 2-core Sapphire Rapids VM this was written on (F32 is never repacked);
``--llama-no-amx`` builds llama.cpp for the CPU's AVX-512 without its AMX kernels, so that
its repacked weights run there (on its AVX-512 kernels). Reported: tokens/s per side, decode tokens/s (the
tokens after the first over the time after the prompt pass), prompt processing tokens/s,
and whether each side's text agrees with draftgate's plain text (the shorter a prefix of
the longer: llama-lookup may overshoot the limit by part of a draft); llama-lookup's text
is also compared with llama.cpp's own plain text.

``--gguf FILE`` runs every side on that file as it is instead (ours loaded with
``--dtype``, e.g. ``native``; no ``--llama-quant`` conversion), e.g. a file that
``benchmarks.bench_models --keep`` left.

``--prefill`` then measures prompt processing alone at each length, interleaved: one
real text (the workload's messages and documents, repeated as needed) cut to exactly N
of our tokens; ours through ``bench_decode.prefill`` (``--chunk``-row steps, the engine's
prompt budget by default), llama.cpp's ``llama-completion`` on that text decoded (its own
token count reported beside ours), and each side's rate at the longest length over its
rate at the shortest.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tarfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_decode import prefill
from benchmarks.bench_speculative import document, run_plain, run_speculative
from benchmarks.harness import parse, workload, write_json
from gateway.audit.workload import WorkloadItem
from local_verifier.engine import TOKEN_BUDGET, Engine, GenerationRequest
from local_verifier.loader import LoadedModel, load_model, smollm2_path

SMOKE = ("--limit", "1", "--max-tokens", "8", "--prefill", "128,256")
SDIST = "llama-cpp-python==0.3.36"
TARGETS = ("llama-completion", "llama-lookup", "llama-quantize", "llama-bench")
SIDES = ("llama_plain", "llama_lookup", "plain", "speculative")


# llama.cpp built for an AVX-512 CPU without its AMX kernels (which -DGGML_NATIVE=ON adds on
# a CPU with AMX): its repacked weights then take its AVX-512 kernels.
NO_AMX = ["-DGGML_NATIVE=OFF"] + [
    f"-DGGML_{isa}=ON"
    for isa in (
        "AVX",
        "AVX2",
        "FMA",
        "F16C",
        "BMI2",
        "AVX512",
        "AVX512_VBMI",
        "AVX512_VNNI",
        "AVX512_BF16",
    )
]


def build(build_dir: Path, sdist: Path | None, amx: bool = True) -> Path:
    """The directory of the built llama.cpp binaries (built once, then reused): for this CPU
    (``-DGGML_NATIVE=ON``, in ``build_dir/build``), or with ``amx`` False for its AVX-512
    without AMX (``NO_AMX``, in ``build_dir/build-no-amx``), both from one extracted source."""
    out = build_dir / ("build" if amx else "build-no-amx")
    bin_dir = out / "bin"
    if all((bin_dir / t).exists() for t in TARGETS):
        return bin_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    if next(build_dir.glob("llama_cpp_python-*/vendor/llama.cpp"), None) is None:
        if sdist is None:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", SDIST, "--no-deps", "--no-binary"]
                + [":all:", "-d", str(build_dir)],
                check=True,
            )
            sdist = next(build_dir.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(build_dir, filter="data")
    cmake = ["cmake", "-S", str(source_dir(build_dir)), "-B", str(out)]
    subprocess.run(
        cmake
        + ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF"]
        + (["-DGGML_NATIVE=ON"] if amx else NO_AMX)
        + ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
        check=True,
    )
    subprocess.run(["cmake", "--build", str(out), "-j", "--target", *TARGETS], check=True)
    return bin_dir


def quant_weights(bin_dir: Path, build_dir: Path, quant: str) -> Path:
    """SmolLM2's GGUF converted to ``quant`` (F32, Q8_0, Q4_1, ...) by llama.cpp's own
    quantize tool."""
    out = build_dir / f"smollm2-{quant.lower()}.gguf"
    if not out.exists():
        llama_quantize(bin_dir, smollm2_path(), out, quant)
    return out


def llama_quantize(bin_dir: Path, source: Path, out: Path, quant: str) -> None:
    """``source`` written to ``out`` in ``quant`` by ``llama-quantize``."""
    _run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(source), str(out), quant])


def source_dir(build_dir: Path) -> Path:
    """The llama.cpp source that ``build`` extracted into ``build_dir``."""
    return next(build_dir.glob("llama_cpp_python-*/vendor/llama.cpp"))


def converter(build_dir: Path) -> list[str]:
    """The command of llama.cpp's own ``convert_hf_to_gguf.py``: on this interpreter where it
    has what the converter imports, else in a virtual environment in ``build_dir`` over this
    one's packages, adding the one it lacks (``sentencepiece``, from the converter's own
    requirements: it is imported before any tokenizer is looked for)."""
    script = str(source_dir(build_dir) / "convert_hf_to_gguf.py")
    if importlib.util.find_spec("sentencepiece") is not None:
        return [sys.executable, script]
    venv = build_dir / "convert-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
        _run([str(python), "-m", "pip", "install", "sentencepiece"])
    return [str(python), script]


def convert(build_dir: Path, checkpoint: Path, out: Path, outtype: str) -> None:
    """The Hugging Face ``checkpoint`` written to ``out`` by llama.cpp's converter."""
    _run([*converter(build_dir), str(checkpoint), "--outtype", outtype, "--outfile", str(out)])


def llama_bench(
    bin_dir: Path, weights: Path, threads: int, repeats: int, tests: list[str]
) -> dict[str, Any]:
    """One ``llama-bench`` test in a process of its own (``tests``: ``["-p", "512", "-n", "0"]``
    times a prompt pass, ``["-p", "0", "-n", "32", "-d", "32"]`` 32 decode steps after a
    32-token context): its mean tokens/s over ``repeats`` runs after a warm-up, their
    standard deviation, its name and the model type it read."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(weights), "-t", str(threads)]
    (row,) = json.loads(_run([*cmd, "-r", str(repeats), "-o", "json", *tests]))
    depth = f"@d{row['n_depth']}" if row["n_depth"] else ""
    name = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
    return {
        "test": name + depth,
        "tok_s": round(row["avg_ts"], 2),
        "tok_s_stddev": round(row["stddev_ts"], 2),
        "threads": row["n_threads"],
        "model_type": row["model_type"],
    }


def llama_version(bin_dir: Path) -> str:
    """The build's version line (``version: N (commit)``)."""
    done = subprocess.run(
        [str(bin_dir / "llama-bench"), "--version"], capture_output=True, text=True
    )
    return next(line for line in (done.stdout + done.stderr).splitlines() if "version" in line)


def _run(cmd: list[str]) -> str:
    """``cmd``'s standard output; its output's tail in the error where it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def _seconds(pattern: str, log: str) -> tuple[float, int]:
    """(seconds, tokens) of a llama_perf line such as ``prompt eval time = X ms / N tokens``."""
    match = re.search(pattern + r"\s*=\s*([\d.]+) ms /\s*(\d+)", log)
    if match is None:
        raise RuntimeError(f"no {pattern!r} timing in llama.cpp's output:\n{log[-2000:]}")
    return float(match.group(1)) / 1000, int(match.group(2))


def run_llama(
    binary: Path,
    weights: Path,
    prompt: Path,
    limit: int,
    threads: int,
    extra: list[str],
    context: int = 8192,
    repack: bool = False,
) -> dict[str, Any]:
    """One greedy llama.cpp run: its text, prompt tokens and seconds, decode seconds, tokens."""
    cmd = [str(binary), "-m", str(weights), "-f", str(prompt), "-n", str(limit), "--temp", "0"]
    cmd += ["-t", str(threads), "-c", str(context), "--no-escape", *extra]
    cmd += [] if repack else ["--no-repack"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    log = done.stderr
    if binary.name == "llama-lookup":
        enc = re.search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        if enc is None or dec is None:
            raise RuntimeError(f"no lookup timings in llama.cpp's output:\n{log[-2000:]}")
        prefill_s, decode_s, tokens = float(enc.group(2)), float(dec.group(2)), int(dec.group(1))
        prompt_tokens = int(enc.group(1))
        out, prompt_text = done.stdout.lstrip("\n"), prompt.read_text().removesuffix("\n")
        text = out[len(prompt_text) :] if out.startswith(prompt_text) else out
    else:
        prefill_s, prompt_tokens = _seconds("prompt eval time", log)
        decode_s, runs = _seconds(r"(?<!prompt )eval time", log)
        tokens = runs + 1  # the first token comes from the prompt pass
        text = done.stdout.removesuffix("\n").removesuffix(" [end of text]")
    return {
        "text": text.strip(),
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "wall": prefill_s + decode_s,
    }


def _same(text: str, reference: str) -> bool:
    """Whether ``text`` agrees with ``reference`` (llama-lookup may run past the token limit
    by part of a draft, so the shorter text must be a prefix of the longer one)."""
    return bool(text and reference) and (text.startswith(reference) or reference.startswith(text))


def long_text(lm: LoadedModel, records: list[WorkloadItem], length: int) -> list[int]:
    """The first ``length`` of our token ids of the records' messages and documents, one
    after another, repeated as needed (real text, no chat template)."""
    parts = [str(m["content"]) for r in records for m in r.messages]
    parts += [d["text"] for r in records for d in r.documents]
    ids = lm.tokenizer.encode("\n\n".join(parts))
    return (ids * (length // len(ids) + 1))[:length]


def prefill_rates(
    lm: LoadedModel,
    records: list[WorkloadItem],
    lengths: list[int],
    chunk: int,
    llama: Callable[..., dict[str, Any]],
    prompt_file: Path,
) -> list[dict[str, Any]]:
    """Prompt processing tokens/s of ours and of llama.cpp (``llama(context=...)`` runs it
    on ``prompt_file``) on the same text at each length, interleaved (order alternating)."""
    entries = []
    for n, length in enumerate(lengths):
        ids = long_text(lm, records, length)
        prompt_file.write_text(lm.tokenizer.decode(ids) + "\n")  # -f drops one newline
        sides: dict[str, dict[str, Any]] = {}
        for side in ("ours", "llama") if n % 2 == 0 else ("llama", "ours"):
            if side == "ours":
                sides[side] = prefill(lm, length, chunk, torch.tensor(ids))
            else:
                run = llama(context=length + 64)
                sides[side] = {
                    "tokens": run["prompt_tokens"],
                    "seconds": round(run["prefill_s"], 2),
                    "tok_s": round(run["prompt_tokens"] / run["prefill_s"], 1),
                }
        entry = {
            "length": length,
            "ours": sides["ours"],
            "llama": sides["llama"],
            "ours_vs_llama": round(sides["ours"]["tok_s"] / sides["llama"]["tok_s"], 3),
        }
        entries.append(entry)
        print(json.dumps(entry), flush=True)
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--sdist", type=Path, default=None, help="llama-cpp-python sdist file")
    parser.add_argument("--workload", type=Path, default=None, help="default: the shipped one")
    parser.add_argument("--category", default="code_edit")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="a GGUF file both sides run as it is (ours with --dtype, e.g. native), instead "
        "of --model and --llama-quant",
    )
    parser.add_argument(
        "--dtype", default=None, help="ours: float32 or bf16 (default: the machine's)"
    )
    parser.add_argument(
        "--llama-quant",
        default="F32",
        help="llama.cpp's weights, comma-separated: the first for llama_plain and "
        "llama_lookup, each further one adds a llama_plain_<quant> side",
    )
    parser.add_argument(
        "--llama-repack",
        action="store_true",
        help="let llama.cpp repack quantized weights (its AMX int8 path: faults on some VMs)",
    )
    parser.add_argument(
        "--llama-no-amx",
        action="store_true",
        help="llama.cpp built for this CPU's AVX-512 without its AMX kernels (in "
        "BUILD_DIR/build-no-amx), so that --llama-repack runs where its AMX path faults",
    )
    parser.add_argument("--prefill", default="", help="prompt lengths, e.g. 1024,4096,8192")
    parser.add_argument("--chunk", type=int, default=TOKEN_BUDGET, help="our prompt rows/step")
    parser.add_argument("--json", type=Path, default=None)
    args = parse(parser, SMOKE)

    bin_dir = build(args.build_dir, args.sdist, amx=not args.llama_no_amx)
    if args.gguf is not None:  # one file, as it is, on every side
        quants = [args.gguf.name]
        weights = {args.gguf.name: args.gguf}
    else:
        quants = [q for q in args.llama_quant.split(",") if q]
        weights = {q: quant_weights(bin_dir, args.build_dir, q) for q in quants}
    extra_sides = {f"llama_plain_{q.lower()}": q for q in quants[1:]}
    sides = (*SIDES, *extra_sides)
    completion_sides = ("llama_plain", *extra_sides)
    # both sides on --threads (the loader would pick 1 or 2 by the moment's load)
    model = args.model if args.gguf is None else str(args.gguf)
    lm: LoadedModel = load_model(model, dtype=args.dtype, tune_threads=False)
    torch.set_num_threads(args.threads)
    engine = Engine(lm)
    every = workload(args.workload)
    records = [r for r in every if r.category == args.category][: args.limit]
    prompt_file = args.build_dir / "prompt.txt"
    warm = lm.tokenizer.encode(
        lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    )
    run_plain(lm, warm, 8)
    run_speculative(engine, GenerationRequest(prompt_ids=warm, max_tokens=8))
    rows = []
    for n, record in enumerate(records):
        text = lm.tokenizer.apply_chat_template(record.messages)
        ids = lm.tokenizer.encode(text)
        prompt_file.write_text(text + "\n")  # llama.cpp's -f drops one trailing newline
        limit = min(args.max_tokens, record.max_tokens)
        req = GenerationRequest(
            prompt_ids=ids,
            max_tokens=limit,
            prediction=record.prediction,
            documents=[document(lm, d["text"]) for d in record.documents],
        )
        runs: dict[str, dict[str, Any]] = {}
        for side in sides if n % 2 == 0 else sides[::-1]:  # alternate to spread drift
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
                w = weights[extra_sides.get(side, quants[0])]
                runs[side] = run_llama(
                    binary, w, prompt_file, limit, args.threads, extra, repack=args.llama_repack
                )
        for side in ("plain", "speculative"):
            runs[side]["tokens"] = len(runs[side]["ids"])
        runs["plain"]["decode_s"] = runs["plain"]["decode"]
        runs["speculative"]["decode_s"] = (
            runs["speculative"]["wall"] - runs["speculative"]["prefill"]
        )
        reference = runs["plain"]["text"].strip()
        row = {
            "id": record.id,
            "prompt_tokens": len(ids),
            "tokens": {s: runs[s]["tokens"] for s in sides},
            "tps": {s: round(runs[s]["tokens"] / runs[s]["wall"], 2) for s in sides},
            "decode_s": {s: round(runs[s]["decode_s"], 4) for s in sides},
            "decode_tps": {
                s: round(max(runs[s]["tokens"] - 1, 0) / runs[s]["decode_s"], 2) for s in sides
            },
            "prefill_tps": {s: round(len(ids) / runs[s]["prefill"], 1) for s in ("plain",)}
            | {s: round(len(ids) / runs[s]["prefill_s"], 1) for s in completion_sides},
            "llama_prompt_tokens": runs["llama_plain"]["prompt_tokens"],
            "identical_to_plain": {s: _same(runs[s]["text"].strip(), reference) for s in sides},
            "llama_lookup_identical_to_llama_plain": _same(
                runs["llama_lookup"]["text"].strip(), runs["llama_plain"]["text"].strip()
            ),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {
        "tps": {
            s: round(
                sum(r["tokens"][s] for r in rows) / sum(r["tokens"][s] / r["tps"][s] for r in rows),
                2,
            )
            for s in sides
        },
        "decode_tps": {
            s: round(
                sum(max(r["tokens"][s] - 1, 0) for r in rows) / sum(r["decode_s"][s] for r in rows),
                2,
            )
            for s in sides
        },
        "prefill_tps_median": {
            s: statistics.median(r["prefill_tps"][s] for r in rows)
            for s in ("plain", *completion_sides)
        },
        "identical_to_plain": {s: sum(r["identical_to_plain"][s] for r in rows) for s in sides},
        "llama_lookup_identical_to_llama_plain": sum(
            r["llama_lookup_identical_to_llama_plain"] for r in rows
        ),
        "prompts": len(rows),
        "dtype": str(lm.dtype).removeprefix("torch."),
        "llama_quant": quants,
        "threads": args.threads,
    }
    lengths = sorted(int(n) for n in args.prefill.split(",") if n)
    if lengths:
        completion = (bin_dir / "llama-completion", weights[quants[0]], prompt_file, 1)
        llama = partial(
            run_llama,
            *completion,
            args.threads,
            ["-no-cnv", "--no-display-prompt"],
            repack=args.llama_repack,
        )
        entries = prefill_rates(lm, every, lengths, args.chunk, llama, prompt_file)
        summary["prefill"] = entries
        summary["prefill_chunk"] = args.chunk
        if len(entries) > 1:
            short, long = entries[0], entries[-1]
            summary["prefill_long_vs_short"] = {
                "lengths": [short["length"], long["length"]],
                "ours": round(long["ours"]["tok_s"] / short["ours"]["tok_s"], 3),
                "llama": round(long["llama"]["tok_s"] / short["llama"]["tok_s"], 3),
            }
    print(json.dumps(summary, indent=1))
    if args.json:
        write_json(args.json, {"summary": summary, "prompts": rows})


if __name__ == "__main__":
    main()
