#!/usr/bin/env bash
# The REAL pair on the H200 (issue 15): distil the SmolLM2-135M draft with `dspark distill`, `dspark bench`
# it against plain decoding, and run other REAL-pair measurements, over consecutive device calls on one
# warm machine (state in /tmp/dspark-distill, kept ~30 s between calls).
#
# The device takes at most 64 MiB a call (the repo's working tree included), so the 98 MB target travels
# in parts (.gpu/target.partNN, appended on arrival) and is checked against its pinned sha256 there.
#
#   bash study/gpu_distill.sh pack [WORKDIR] [PART]   # here: .gpu/{p1 (source, wheels), target parts of PART MiB
#                                                       # (or bytes, when over 1000)}
#   bash study/gpu_distill.sh start            # call 1 (carry .gpu/p1 + a part): wheels, source, CUDA build (bg)
#   bash study/gpu_distill.sh recv             # any call: append the target parts carried in .gpu/parts/
#   bash study/gpu_distill.sh train [ARGS]     # distill in the background (target complete), then wait
#   bash study/gpu_distill.sh wait             # until distill ends; draft + report to $OUT
#   bash study/gpu_distill.sh bench [ARGS]     # after the build: dspark bench on the H200, records to $OUT
#   bash study/gpu_distill.sh exec CMD...      # after the build: any command with the engine and pair set
#                                                # ($DSPARK_TARGET, $DSPARK_DRAFT, DSPARK_LLAMA_BIN exported)
#   bash study/gpu_distill.sh standin          # background: the full-width stand-in pair into $W/pair, where
#                                                # gpu_load.sh / gpu_rpc.sh find it with DSPARK_STUDY_DIR=$W
#
# WORKDIR for pack: a work folder from `dspark distill ... --prepare-only --work WORKDIR` (stage 1 needs a
# llama-server, which the device has only once its build is done); its prompts.json travels gzipped.
# The trained draft (~17 MB) comes back as $OUT/draft.partNN (15 MiB each; the device returns <= 16 MiB a file).
set -euo pipefail
REPO=$(pwd)
W=${DSPARK_DISTILL_DIR:-/tmp/dspark-distill}
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
T=$W/SmolLM2-135M-Instruct.Q4_1.gguf
# dspark itself is the repo's working tree (it travels with every call); a carried .gpu/p1/dspark.tar.gz wins
export DSPARK_CACHE_DIR=$W/cache PYTHONPATH=$W/site:$W/dspark:$REPO PYTHONUNBUFFERED=1
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s $(date +%H:%M:%S)] $*" | tee -a "$OUT/gpu.log"; }
# -P: the repo checkout in the working folder must not shadow the dspark that was carried
dspark() { "$PY" -P -m dsparkcli.cli.app "$@"; }
phase=${1:?phase}; shift

case "$phase" in
pack)  # here, with the project venv: what the device lacks
  work=${1:-} part_mib=${2:-40}
  src=$(${VENV_PY:-.venv/bin/python} -m dsparkcli.cli.app fetch smollm2-135m --json --yes | ${VENV_PY:-.venv/bin/python} -c \
    "import json,sys; print(next(f['path'] for f in json.load(sys.stdin)['files'] if f['role'] == 'target'))")
  rm -rf .gpu/p1 .gpu/parts && mkdir -p .gpu/p1 .gpu/parts
  ${VENV_PY:-.venv/bin/python} -m study.pack_gpu_bundle --out .gpu/bundle >/dev/null
  # on the device already (its image has them, see the device tool's KINDS.md) or unused there: 2.8 MB less
  for w in pillow hf_xet pygments pyyaml requests tqdm certifi charset_normalizer idna; do rm -f .gpu/bundle/wheels/$w-*; done
  mv .gpu/bundle/llama.cpp.tar.xz .gpu/bundle/wheels .gpu/p1/
  # part_mib: MiB, or a byte count with a unit split takes (e.g. 50000000 bytes: "50000000")
  case "$part_mib" in *[!0-9]*) size=$part_mib ;; *) [ "$part_mib" -gt 1000 ] && size=$part_mib || size=${part_mib}M ;; esac
  split -b "$size" -d "$src" .gpu/parts/target.part
  [ -z "$work" ] || gzip -9 -c "$work/prompts.json" > .gpu/p1/prompts.json.gz
  du -sh .gpu/p1 .gpu/parts/*
  ;;
recv)  # parts arrive in order over calls; a part already appended (it stays in the tree) is skipped
  touch "$W/received.txt"
  for p in "${PARTS:-.gpu/parts}"/target.part*; do  # PARTS: this call's folder of parts
    [ -f "$p" ] || continue
    name=$(basename "$p")
    grep -qx "$name" "$W/received.txt" && continue
    cat "$p" >> "$W/target.partial" && echo "$name" >> "$W/received.txt" && say "received $name"
  done
  if [ -f "$W/target.partial" ] && [ "$(stat -c %s "$W/target.partial")" -ge 98362432 ]; then
    mv "$W/target.partial" "$T" && echo "$SHA  $T" | sha256sum -c - | tee -a "$OUT/gpu.log"
  fi
  ;;
exec)
  while [ ! -f "$W/build.rc" ]; do sleep 5; done
  export DSPARK_LLAMA_BIN=$(dirname "$(dspark engine path)") DSPARK_TARGET=$T
  export DSPARK_DRAFT=${DSPARK_DRAFT:-$REPO/dsparkcli/data/drafts/smollm2-135m-dspark-q8_0.gguf}
  say "exec $*"
  "$@" 2>&1 | tee -a "$OUT/exec.log"
  ;;
start)
  mkdir -p "$W/site" "$W/dspark"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" .gpu/p1/wheels/*.whl
  [ ! -f .gpu/p1/dspark.tar.gz ] || tar xzf .gpu/p1/dspark.tar.gz -C "$W/dspark"
  # the sdist's layout, so dspark names the build by the pinned commit (0c1e570-cuda-sm90)
  SRC=$W/src/llama_cpp_python-0.3.36/vendor/llama.cpp
  mkdir -p "$(dirname "$SRC")" && tar xf .gpu/p1/llama.cpp.tar.xz -C "$(dirname "$SRC")"
  [ ! -f .gpu/p1/prompts.json.gz ] || { mkdir -p "$W/work"; gunzip -c .gpu/p1/prompts.json.gz > "$W/work/prompts.json"; }
  say "source $SRC; starting the CUDA build in the background"
  setsid nohup bash -c "\"$PY\" -P -m dsparkcli.cli.app engine build --backend cuda --cuda-arch 90 --source \"$SRC\" --jobs \$(nproc) --json > $W/build.json 2> $W/build.err; echo \$? > $W/build.rc" > /dev/null 2>&1 &
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; } | tee -a "$OUT/gpu.log"
  "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())" | tee -a "$OUT/gpu.log"
  dspark --version | tee -a "$OUT/gpu.log"
  ;;
train)
  [ -f "$T" ] || { echo "the target has not arrived in full: carry the remaining .gpu/target.part* (recv)" >&2; exit 2; }
  mkdir -p "$W/work"
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
    if [ -f "$W/smollm2-135m-dspark.gguf" ]; then
      split -b 15M -d "$W/smollm2-135m-dspark.gguf" "$OUT/draft.part"
      sha256sum "$W/smollm2-135m-dspark.gguf" | tee -a "$OUT/gpu.log"
    fi
  else
    say "distill still running"
  fi
  ;;
bench)
  while [ ! -f "$W/build.rc" ]; do sleep 10; done
  say "build rc=$(cat "$W/build.rc"): $(tail -c 300 "$W/build.json")"
  dspark doctor 2>&1 | tail -4 | tee -a "$OUT/gpu.log"
  say "bench $*"
  D=$W/smollm2-135m-dspark.gguf; [ -f "$D" ] || D=$REPO/dsparkcli/data/drafts/smollm2-135m-dspark-q8_0.gguf
  dspark bench --target "$T" --draft "smollm2-135m-dspark=$D" --out "$OUT/bench-h200.jsonl" "$@" \
    -- -ngl 99 -ngld 99 -fa on 2>&1 | tee "$OUT/bench-h200.md"
  ;;
standin)
  mkdir -p "$W/pair"
  setsid nohup "$PY" -c "from dsparkcli.synth.full_width import write_full_width as w
print(w('$W/pair', qtype='Q4_K', draft_qtype='Q8_0', target_arch='qwen35moe').manifest)" > "$W/pair.log" 2>&1 &
  say "writing the full-width stand-in pair into $W/pair in the background (log $W/pair.log)"
  ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
say "phase $phase done"
