#!/usr/bin/env bash
# H200 concurrency table (issue 17): plain vs draft with 1, 2, 4, 8, 16 clients in flight, through
# `dspark bench --concurrency` (llama-server -np N per level; aggregate tok/s, TTFT and latency
# p50/p95/max, speedup vs plain at the same N, acceptance, and the N from which the draft stops paying).
#
# Needs .gpu/ from study/pack_gpu_bundle.py (carry [".gpu"] and the pair's files). Run from the repo root:
#   bash study/gpu_load.sh --target T.gguf --draft D.gguf           # (a) the real tiny pair, budget 3
#   bash study/gpu_load.sh --stand-in                               # (b) full-width stand-in: SYNTHETIC
#                                                                     #     acceptance L 5.407 at its best budget 5
#   bash study/gpu_load.sh --cpu-smoke                              # here: CPU engine, known-answer pair (~30 s)
#
# The CUDA engine is built first (study/gpu_study.sh --phase build) unless this machine already has it.
# Options: --budget "K ..." (default 3; 5 with --stand-in; several: one draft configuration each)  --levels "1 2 4 8 16"  --reps R (3)
#          --limit P (prompts per text category: math, code, general; default 4)  --n-predict N (256)
#          --ignore-eos  --synth-len L (with --stand-in, default 5.407)  --label NAME (names the outputs)
#          --manifest M (with --stand-in: this full-width pair's manifest.json instead of the study's)
# Output in $OUT (default ./gpu-out): load-NAME.jsonl (every record, with provenance), load-NAME.md (the
# table and the crossover line), load-NAME.png, load.log.
set -euo pipefail

T0=$(date +%s)
REPO=$(pwd)
TARGET="" DRAFT="" MANIFEST="" STANDIN=0 SMOKE=0 BUDGET="" LEVELS="1 2 4 8 16" REPS=3 LIMIT=4 NPRED=256 EOS=() SYNTH="" LABEL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET=$2; shift 2 ;;
    --draft) DRAFT=$2; shift 2 ;;
    --stand-in) STANDIN=1; shift ;;
    --manifest) STANDIN=1 MANIFEST=$2; shift 2 ;;
    --cpu-smoke) SMOKE=1; shift ;;
    --budget) BUDGET=$2; shift 2 ;;
    --levels) LEVELS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --n-predict) NPRED=$2; shift 2 ;;
    --ignore-eos) EOS=(--ignore-eos); shift ;;
    --synth-len) SYNTH=$2; shift 2 ;;
    --label) LABEL=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_load.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

# shellcheck source=gpu_common.sh
source "$REPO/study/gpu_common.sh"
device_env load.log
GPU_ARGS=(-- -ngl 99 -ngld 99 -fa on)
CTX=4096

if [ "$SMOKE" = 1 ]; then
  # everything but the GPU: the CPU engine, a known-answer pair, two levels, a few short requests
  smoke_pair load
  trap 'rm -rf "$SMOKE_DIR"' EXIT
  LEVELS=${LEVELS_SMOKE:-"1 2"} REPS=1 LIMIT=1 NPRED=32 CTX=512 LABEL=${LABEL:-smoke}
  GPU_ARGS=(-t 1)
else
  cuda_engine
  say "engine: $("$PY" -m dsparkcli.cli.app engine path)"
fi
dspark() { "$PY" -m dsparkcli.cli.app "$@"; }

SYNTH_ARGS=()
if [ "$STANDIN" = 1 ]; then
  BUDGET=${BUDGET:-5} SYNTH=${SYNTH:-5.407} LABEL=${LABEL:-standin}
  standin_pair
  SYNTH_ARGS=(--synth-len "$SYNTH" --ignore-eos --seed 1)
  say "stand-in pair: $TARGET (SYNTHETIC acceptance L=$SYNTH)"
fi
[ -n "$TARGET" ] && [ -n "$DRAFT" ] || { echo "gpu_load.sh: give --target and --draft, --stand-in or --cpu-smoke" >&2; exit 2; }
BUDGET=${BUDGET:-3} LABEL=${LABEL:-real}

read -r -a LEVEL_ARGS <<< "$LEVELS"
read -r -a BUDGET_ARGS <<< "$BUDGET"
say "bench: budget $BUDGET, levels ${LEVELS}, reps $REPS, $LIMIT prompts per text category, $NPRED tokens"
set +e
dspark bench --target "$TARGET" --draft "$LABEL=$DRAFT" --budget "${BUDGET_ARGS[@]}" --concurrency "${LEVEL_ARGS[@]}" \
  --category text --limit "$LIMIT" --reps "$REPS" --warmup 1 --n-predict "$NPRED" --ctx "$CTX" "${EOS[@]}" \
  "${SYNTH_ARGS[@]}" --out "$OUT/load-$LABEL.jsonl" --plot "$OUT/load-$LABEL.png" --format md "${GPU_ARGS[@]}" \
  > "$OUT/load-$LABEL.md" 2>> "$LOG"
RC=$?
set -e
say "dspark bench rc=$RC; $(tail -1 "$OUT/load-$LABEL.md" 2>/dev/null)"
[ "$RC" = 0 ] || { tail -20 "$LOG"; exit "$RC"; }
say "done in $(( $(date +%s) - T0 )) s; table: $OUT/load-$LABEL.md"
