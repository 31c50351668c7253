#!/usr/bin/env bash
# The H200 RPC check (issue 18): one GPU, two processes. A pair served directly vs through a local
# `ggml-rpc-server` worker on the same GPU (study/rpc_check.py): identical tokens and drafted/accepted
# counts, and the decode tok/s ratio rpc / direct. Two device calls on one warm machine:
#
#   .venv/bin/python -m study.pack_gpu_bundle         # here, once: .gpu/ (carry [".gpu"] in call 1)
#   bash study/gpu_rpc.sh build     # call 1: wheels, source, the CUDA engine WITH the RPC backend (~5 min)
#   bash study/gpu_rpc.sh check     # call 2: known-answer pair, then the full-width stand-in (~4-6 min)
#
# `check` options (environment): ARCH=qwen35moe|qwen3moe (stand-in target, default qwen35moe), SCALE=1.0
# (the stand-in's width; a CPU smoke run here: SCALE=0.02 PYTHON=.venv/bin/python), SYNTH_LEN=5.4
# (the stand-in's random draft accepts nothing; llama.cpp's synthetic acceptance exercises real
# multi-token verification steps), TARGET=... DRAFT=... (also check a real pair, e.g. smollm2-135m's files
# carried as in gpu_distill.sh). Records: $OUT/rpc_check.jsonl (one `summary` line per pair), log $OUT/rpc.log.
# On a CPU smoke run the Q4_K stand-in's tokens differ (llama-server repacks Q4_K for its own CPU kernels,
# a worker serves plain buffers; `--no-repack` on both makes them equal); the F32 known-answer pair is exact.
set -euo pipefail
REPO=$(pwd)
W=${DSPARK_STUDY_DIR:-/tmp/dspark-study}
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$W"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/rpc.log"; }
phase=${1:-build}
case "$phase" in
build)
  # gpu_study's build phase: `dspark engine build --backend cuda` now includes GGML_RPC (cache key -rpc)
  bash study/gpu_study.sh --phase build
  ls "$W"/cache/engine/*-rpc/build/bin/ggml-rpc-server > /dev/null && say "CUDA engine with RPC ready" ;;
check)
  export DSPARK_CACHE_DIR=$W/cache PYTHONPATH=$W/site:$REPO${PYTHONPATH:+:$PYTHONPATH}
  GPU=(-- -ngl 99 -ngld 99 -fa on)
  # each check prints one JSON line (tokens_equal, counts_equal, predicted, ratio, medians); a failed one
  # (exit 1: tokens or counts differ) does not stop the next
  check() { set +e; "$PY" -m study.rpc_check --out "$OUT/rpc_check.jsonl" --log-dir "$W/rpc-logs" "$@" \
              > "$W/check.log" 2>&1; local rc=$?; set -e; say "rc=$rc $(tail -1 "$W/check.log")"; }
  say "known-answer pair (exact prediction): direct vs worker"
  check --synth "$W/ka" --n-predict 256 --prompts 4 --reps 3 "${GPU[@]}"
  ARCH=${ARCH:-qwen35moe}
  M=$(ls "$W"/pair/manifest-*"$ARCH"*.json 2>/dev/null | head -1 || true)
  if [ -z "$M" ]; then
    say "writing the full-width $ARCH stand-in (Q4_K target, Q8_0 draft)"
    M=$("$PY" -c "from dsparkcli.synth.full_width import write_full_width as w
print(w('$W/pair', scale=${SCALE:-1.0}, qtype='Q4_K', draft_qtype='Q8_0', target_arch='$ARCH').manifest)" | tail -1)
  fi
  TGT=$("$PY" -c "import json,os;m=json.load(open('$M'));print(os.path.join(os.path.dirname('$M'),m['target']['file']))")
  DRF=$("$PY" -c "import json,os;m=json.load(open('$M'));print(os.path.join(os.path.dirname('$M'),m['draft']['file']))")
  say "stand-in $M: direct vs worker (SYNTHETIC acceptance --spec-synth-len ${SYNTH_LEN:-5.4})"
  check --target "$TGT" --draft "$DRF" --n-predict 256 --prompts 2 --reps 3 --ctx 4096 "${GPU[@]}" \
    --synth-len "${SYNTH_LEN:-5.4}"
  if [ -n "${TARGET:-}" ]; then
    say "real pair $TARGET: direct vs worker"
    check --target "$TARGET" --draft "$DRAFT" --n-predict 256 --prompts 4 --reps 3 "${GPU[@]}"
  fi
  tail -c 20000 "$W"/rpc-logs/*.log > "$OUT/rpc-server-logs.tail" 2>/dev/null || true
  say "done: $OUT/rpc_check.jsonl" ;;
*) echo "gpu_rpc.sh: build or check" >&2; exit 2 ;;
esac
