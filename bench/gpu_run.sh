#!/bin/sh
# On the GPU host, in the folder bench/gpu_pack.sh built: install offline, run `python -m bench gpu`.
# Usage: sh run.sh [bench gpu options]      (default: --device cuda; figures saved next to this script)
# Env:   PYTHON=python3.12  CUBLAS13_DIR=/path/with/libcublas.so.13 (found on its own otherwise)
set -eu
KIT=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/sy-bench-gpu-XXXXXX)   # outside any repository; removed at the end
trap 'rm -rf "$WORK"' EXIT

# Its own venv over the host's packages (numpy, tokenizers, onnxruntime, huggingface_hub stay the host's).
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet --no-index --no-deps "$KIT"/wheels/*.whl
cat "$KIT"/model.tar.part-* | tar -x -C "$WORK"
MODEL=$(find "$WORK" -maxdepth 2 -name model.bin -exec dirname {} \; | head -n 1)
mkdir "$WORK/code" && tar -x -C "$WORK/code" -f "$KIT/code.tar"

# CTranslate2's wheel opens libcublas.so.12 / libcublasLt.so.12. With CUDA 13 only, cuBLAS 13 under those names.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.12 '; then
    CUBLAS13_DIR=${CUBLAS13_DIR:-$(
        { ldconfig -p 2>/dev/null | awk '/libcublas\.so\.13 /{print $NF}'
          find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib "$("$WORK/venv/bin/python" -c \
               'import site; print(site.getsitepackages()[0])')/nvidia" -name 'libcublas.so.13' 2>/dev/null
        } | head -n 1 | xargs -r dirname)}
    if [ -n "$CUBLAS13_DIR" ]; then
        mkdir "$WORK/cuda12-names"
        ln -s "$CUBLAS13_DIR/libcublas.so.13" "$WORK/cuda12-names/libcublas.so.12"
        ln -s "$CUBLAS13_DIR/libcublasLt.so.13" "$WORK/cuda12-names/libcublasLt.so.12"
        LD_LIBRARY_PATH="$WORK/cuda12-names:$CUBLAS13_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export LD_LIBRARY_PATH
        echo "cuBLAS 13 from $CUBLAS13_DIR under the .so.12 names"
    fi
fi

cd "$WORK/code"
"$WORK/venv/bin/python" -c 'import ctranslate2; print("CUDA devices:", ctranslate2.get_cuda_device_count())'
[ $# -eq 0 ] && set -- --device cuda
OUTFILE="$KIT/bench-gpu-$(hostname)-$(date +%Y%m%d-%H%M%S).txt"
"$WORK/venv/bin/python" -m bench gpu --model "$MODEL" --corpus "$KIT/corpus" "$@" | tee "$OUTFILE"
echo "figures in $OUTFILE"
