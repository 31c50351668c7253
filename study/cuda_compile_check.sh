#!/usr/bin/env bash
# Compile dspark's CUDA patches (the series' files under ggml/src/ggml-cuda) for one GPU architecture on a machine
# with nvcc and no GPU: a check that a rebased series still compiles before device time is spent on a full build.
# cuBLAS's headers come from PyPI's nvidia-cublas wheel (only its include/ is unpacked).
# usage: study/cuda_compile_check.sh LLAMA_CPP_TREE SERIES_DIR OUT_DIR [ARCH]   (ARCH: sm_90, the H200's)
set -euo pipefail
tree=$(realpath "$1") series=$(realpath "$2") out=$3 arch=${4:-sm_90}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
py=${PYTHON:-python3}
"$py" -m pip download --no-deps -q "nvidia-cublas>=13,<14" -d "$work/wheel"
(cd "$work" && unzip -q -o wheel/*.whl 'nvidia/cu13/include/*')
cp -r "$tree/ggml" "$work/ggml"
files=()
for p in "$series"/*.patch; do
  touched=$(grep '^+++ b/ggml/src/ggml-cuda/' "$p" | sed 's|^+++ b/||' || true)
  [ -z "$touched" ] && continue
  (cd "$work" && patch -p1 -s < "$p")
  echo "applied $(basename "$p")"
  for f in $touched; do case $f in *.cu) files+=("$f");; esac; done
done
flags=(-std=c++17 -arch="$arch" -I "$work/ggml/include" -I "$work/ggml/src" -I "$work/ggml/src/ggml-cuda"
       -I "$work/nvidia/cu13/include" -DGGML_CUDA_USE_GRAPHS -DGGML_SCHED_MAX_COPIES=4 -DGGML_BACKEND_BUILD
       -DGGML_BACKEND_SHARED -DGGML_SHARED -D_GNU_SOURCE -DGGML_CUDA_PEER_MAX_BATCH_SIZE=128 --extended-lambda)
{
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "arch: $arch"
  echo "series: $series"
  for f in $(printf '%s\n' "${files[@]}" | sort -u); do
    start=$(date +%s)
    nvcc "${flags[@]}" -c "$work/$f" -o "$work/out.o" 2> "$work/err.txt" && rc=0 || rc=$?
    echo "$f rc=$rc seconds=$(( $(date +%s) - start )) object_bytes=$( [ $rc = 0 ] && stat -c %s "$work/out.o" || echo 0)"
    [ $rc = 0 ] || { grep -m5 -i error "$work/err.txt"; exit $rc; }
  done
} | tee "$out/cuda-compile.txt"
