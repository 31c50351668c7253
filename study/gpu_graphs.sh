#!/usr/bin/env bash
# Issues 32 and 30 on the H200, over consecutive device calls on one warm machine (state in
# /tmp/dspark-distill, kept ~30 s between calls; study/gpu_distill.sh ships the source and builds).
#
# A call carries at most 64 MiB with the repo's working tree, and the REAL target is 98 MB: for the calls,
# study/results/ and the draft leave the working tree (study/gpu_graphs.sh stash / unstash, here), and
#   call1 carries .gpu/p1 (lean llama.cpp tarball + wheels) and .gpu/partsA (the target's first 52 MB):
#         starts the CUDA build (the shipped series) and the MoE stand-in's writing, in the background;
#   call2 carries .gpu/partsB (the rest of the target), .gpu/draft and .gpu/eval (MT-bench/Spec-Bench):
#         the REAL pair's step costs with patches 0006/0007 on, off and without graphs (graph counters), the kit's
#         text prompts at budgets 1-6 vs plain (REAL acceptance), then tune on the kit's text categories;
#   call3 tune on MT-bench's first turns, then bench plain / fixed / auto / adaptive on both (issue 30);
#   call4 the MoE stand-in's step costs, patches 0006/0007 on/off and no graphs (SYNTHETIC).
# Everything lands in $OUT, one folder per leg (at most 8 files come back a call).
# Session 36 ran it (records: study/results/h200/session36) with a first patch 0008 that keyed CUDA graphs per shape
# (--patches 0008 switched it); it measured no gain and the shipped 0008 only counts graph use, so the legs
# now measure 0006 and 0007. Its lean tarball also lacked scripts/ui-assets.cmake (copied in by hand there;
# pack_gpu_bundle.py keeps scripts/ now).
set -euo pipefail
REPO=$(pwd)
W=${DSPARK_DISTILL_DIR:-/tmp/dspark-distill}
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
T=$W/SmolLM2-135M-Instruct.Q4_1.gguf
D=$W/smollm2-135m-dspark-q8_0.gguf
KIT=(--category text --limit 6)
MT=(--prompts "$W/eval/mt_bench_question.jsonl" --limit 3)
GPU=(-- -ngl 99 -ngld 99 -fa on)
export DSPARK_CACHE_DIR=$W/cache PYTHONPATH=$W/site:$REPO PYTHONUNBUFFERED=1
T0=$(date +%s)
mkdir -p "$OUT"
say() { echo "[$(( $(date +%s) - T0 ))s $(date +%H:%M:%S)] $*" | tee -a "$OUT/graphs.log"; }
dspark() { "$PY" -P -m dsparkcli.cli.app "$@"; }
engine() { while [ ! -f "$W/build.rc" ]; do sleep 5; done
  [ "$(cat "$W/build.rc")" = 0 ] || { tail -c 3000 "$W/build.err"; exit 3; }
  DSPARK_LLAMA_BIN=$(dirname "$(dspark engine path)"); export DSPARK_LLAMA_BIN
  say "engine $DSPARK_LLAMA_BIN"; }
pair() { [ -f "$T" ] && [ -f "$D" ] || { say "the REAL pair is not here yet"; exit 2; }; }
# leg NEEDED_S NAME: true when the call (LIMIT_S, default 585) still has NEEDED_S seconds; else says it is skipped
leg() { local left=$(( ${LIMIT_S:-585} - ($(date +%s) - T0) ))
  if [ "$left" -ge "$1" ]; then say "leg $2 ($left s left)"; else say "SKIPPED leg $2: $left s left, needs $1"; return 1; fi; }
phase=${1:?phase}; shift

case "$phase" in
stash)  # here, before call1: what the calls must not carry
  mkdir -p /work/.gpu-stash .gpu/draft .gpu/eval
  [ ! -d study/results ] || mv study/results /work/.gpu-stash/results
  [ ! -f dsparkcli/data/drafts/smollm2-135m-dspark-q8_0.gguf ] || mv dsparkcli/data/drafts/smollm2-135m-dspark-q8_0.gguf .gpu/draft/
  cp ../shared/eval/*.jsonl .gpu/eval/
  exit 0 ;;
unstash)  # here, after the last call
  [ ! -d /work/.gpu-stash/results ] || mv /work/.gpu-stash/results study/results
  [ ! -f .gpu/draft/smollm2-135m-dspark-q8_0.gguf ] || mv .gpu/draft/smollm2-135m-dspark-q8_0.gguf dsparkcli/data/drafts/
  git status --short study/results dsparkcli/data/drafts
  exit 0 ;;
call1)
  bash study/gpu_distill.sh start
  PARTS=.gpu/partsA bash study/gpu_distill.sh recv
  bash study/gpu_distill.sh standin
  ;;
call2)
  PARTS=.gpu/partsB bash study/gpu_distill.sh recv
  cp .gpu/draft/smollm2-135m-dspark-q8_0.gguf "$D" && mkdir -p "$W/eval" && cp .gpu/eval/*.jsonl "$W/eval/"
  sha256sum "$D" | tee -a "$OUT/graphs.log"
  pair; engine
  dspark doctor --selftest 2>&1 | tail -14 | tee -a "$OUT/graphs.log"
  leg 120 real-switches && "$PY" -P -m study.step_switches --target "$T" --draft "$D" --patches 0006 0007 --no-graphs \
    --graph-stats --budgets 1 3 5 7 --reps 3 --n-predict 128 --rounds 2 --out "$OUT/real-switches" "${GPU[@]}" 2>&1 \
    | tee -a "$OUT/graphs.log"
  mkdir -p "$OUT/real-kit"
  leg 140 real-kit && dspark bench --target "$T" --draft "smollm2-135m-dspark=$D" "${KIT[@]}" --budget 1 2 3 4 5 6 \
    --rounds 2 --reps 1 -n 256 --out "$OUT/real-kit/bench.jsonl" "${GPU[@]}" 2>&1 | tee "$OUT/real-kit/bench.md"
  mkdir -p "$OUT/tune"
  if leg 150 tune-kit; then
    dspark tune --target "$T" --draft "$D" "${KIT[@]}" -n 256 --out "$OUT/tune/tune-kit.jsonl" \
      --record "$OUT/tune/tune-kit.json" "${GPU[@]}" 2>&1 | tee -a "$OUT/graphs.log" && touch "$W/tuned-kit"
  fi
  ;;
call3)
  pair; engine
  mkdir -p "$OUT/tune" "$OUT/choice"
  [ -f "$W/tuned-kit" ] || { dspark tune --target "$T" --draft "$D" "${KIT[@]}" -n 256 \
    --out "$OUT/tune/tune-kit.jsonl" --record "$OUT/tune/tune-kit.json" "${GPU[@]}" 2>&1 | tee -a "$OUT/graphs.log"; }
  leg 150 tune-mt && dspark tune --target "$T" --draft "$D" "${MT[@]}" -n 256 --out "$OUT/tune/tune-mt.jsonl" \
    --record "$OUT/tune/tune-mt.json" "${GPU[@]}" 2>&1 | tee -a "$OUT/graphs.log"
  for set in kit mt; do
    if [ $set = kit ]; then P=("${KIT[@]}"); else P=("${MT[@]}"); fi
    leg 120 "choice-$set" || continue
    dspark bench --target "$T" --draft "smollm2-135m-dspark=$D" "${P[@]}" --budget auto adaptive 1 2 3 4 5 \
      --rounds 2 --reps 1 -n 256 --out "$OUT/choice/bench-$set.jsonl" "${GPU[@]}" 2>&1 | tee "$OUT/choice/bench-$set.md"
  done
  ;;
call4)
  engine
  for _ in $(seq 1 60); do grep -q "manifest\|Error" "$W/pair.log" 2>/dev/null && break; sleep 5; done
  grep -q "manifest" "$W/pair.log" || { say "no stand-in: $(tail -c 500 "$W/pair.log")"; exit 3; }
  M=$(ls "$W"/pair/manifest-*.json | head -1)
  "$PY" -P -m study.step_switches --manifest "$M" --patches 0006 0007 --no-graphs --graph-stats --budgets 1 3 7 \
    --reps 3 --n-predict 64 --out "$OUT/standin" "${GPU[@]}" 2>&1 | tee -a "$OUT/graphs.log"
  ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
say "phase $phase done"
