#!/bin/sh
# On the GPU host, in the folder bench/gpu_pack.sh built: install offline, run `python -m bench gpu`.
# Usage: sh run.sh [bench gpu options]      (default: --device cuda; figures saved next to this script)
# Env:   PYTHON=python3.12  CUBLAS13_DIR=/path/with/libcublas.so.13 (found on its own otherwise)
set -eu
KIT=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/sy-bench-gpu-XXXXXX)   # outside any repository; removed at the end
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/code" && tar -x -C "$WORK/code" -f "$KIT/code.tar"
cd "$WORK/code"

# The whole kit as one carry that arrives at once (bench/gpu_carry.py, standard library only): it unpacks
# the wheels over the host's own packages, the model and the corpus, links cuBLAS 13 under the .so.12
# names when the loader has no cuBLAS 12, and runs the bench.
WHOLE_KIT_MIB=65536   # no call limit here: one carry
"$PYTHON" -m bench.gpu_carry pack "$KIT" --into "$WORK/carry" --limit-mib "$WHOLE_KIT_MIB" > /dev/null
[ $# -eq 0 ] && set -- --device cuda
SWITCHYARD_GPU_HOME="$WORK/home" "$PYTHON" -m bench.gpu_carry arrive "$WORK/carry/carry-1" "$@"
cp "$WORK"/home/bench-gpu-*.txt "$KIT"/
echo "figures kept in $KIT"
