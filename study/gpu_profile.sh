#!/usr/bin/env bash
# H200 step profile (issue 19): where a step's milliseconds go, for plain decoding and draft-dspark at
# budgets k = 1 3 7 10 15 on the full-width stand-in (qwen35moe Q4_K, draft Q8_0; SYNTHETIC acceptance,
# --spec-synth-len, labelled as such: by default L = 1, every draft rejected, the cells of BENCHMARKS.md's
# "Step cost per budget" table, so t_step is checked against a published number; --synth-len 5.407 shows
# what accepted tokens add, capped at k+1 per budget). Per configuration study/gpu_profile.py runs
# llama-server twice: alone (--reps timed requests: prompt/eval ms, draft_n, steps from /metrics, the
# draft's ms per call from its statistics line) and under Nsight Compute
#   ncu --target-processes all --metrics gpu__time_duration.sum --csv --print-units base
#       --cache-control none --clock-control none --launch-skip SKIP --launch-count COUNT --log-file F.csv
# (a bounded window of kernels inside a long generation; Nsight Systems does not run on that machine).
# study/profile_to_md.py turns the records into the table (kernel ms per step by kind, the host/sync gap).
#
# Needs .gpu/ from study/pack_gpu_bundle.py (carry [".gpu"]). Run from the repo root:
#   bash study/gpu_profile.sh                    # on the H200: engine (built if missing), stand-in pair, 6 configs
#   bash study/gpu_profile.sh --target T --draft D --synth-len 0   # another pair, its own acceptance
#   bash study/gpu_profile.sh --cpu-smoke        # here: CPU engine, known-answer pair, no ncu (< 60 s)
#
# Wall time on the H200 (estimated, not yet measured): CUDA build 4-5 min on 16 cores when the machine
# has none; stand-in pair write ~2-3 min (reused from $DSPARK_STUDY_DIR/pair if present); then per config
# ~1 min: one timing server (load ~5 s from page cache + 3 x 256 tokens, 1-6 s each) and one ncu server
# (load + 160 tokens + 8000 profiled kernels, one metric, no replay), so ~6-7 min for the 6 configs.
# On a fresh machine: call 1 `--phase prep` (engine + pair, ~8 min), call 2 the profile on the same warm
# machine; if it runs long, --budgets "1 3 7" then --budgets "10 15" (records append; plain runs in both).
# The window: --skip kernels (startup warm-up, the prompt, ~10 steps at ~1.5-2 k kernels per step) then
# --count; a window not inside steady decoding shows as "not periodic" in the table: raise --ncu-n-predict
# or move --skip.
# Options: --budgets "1 3 7 10 15"  --synth-len L (default 1 with the stand-in)  --n-predict N (256)
#          --reps R (3)  --ncu-n-predict N (160)  --skip S (20000)  --count M (8000)  --label NAME  --ncu PATH
#          --manifest M (a full-width pair's manifest.json)  --phase prep (engine and pair only, no profile)
#          --no-plain (budgets only: plain's ncu run alone takes ~90 s on the H200)
# Output in $OUT (default ./gpu-out; the device returns at most 8 files): profile-NAME.jsonl
# (timing/kernels/error records), profile-NAME.md, ncu-csv.tar.gz (ncu's raw CSV per configuration), profile.log.
set -euo pipefail

T0=$(date +%s)
REPO=$(pwd)
TARGET="" DRAFT="" MANIFEST="" SMOKE=0 BUDGETS="1 3 7 10 15" SYNTH="" NPRED=256 REPS=3 NCU_NPRED=160 SKIP=20000 COUNT=8000
LABEL="" NCU=${NCU:-ncu} PHASE=all NO_PLAIN=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET=$2; shift 2 ;;
    --draft) DRAFT=$2; shift 2 ;;
    --manifest) MANIFEST=$2; shift 2 ;;
    --cpu-smoke) SMOKE=1; shift ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    --synth-len) SYNTH=$2; shift 2 ;;
    --n-predict) NPRED=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --ncu-n-predict) NCU_NPRED=$2; shift 2 ;;
    --skip) SKIP=$2; shift 2 ;;
    --count) COUNT=$2; shift 2 ;;
    --label) LABEL=$2; shift 2 ;;
    --ncu) NCU=$2; shift 2 ;;
    --phase) PHASE=$2; shift 2 ;;
    --no-plain) NO_PLAIN=(--no-plain); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_profile.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$PHASE" in all|prep) ;; *) echo "gpu_profile.sh: --phase is all or prep, not $PHASE" >&2; exit 2 ;; esac

# shellcheck source=gpu_common.sh
source "$REPO/study/gpu_common.sh"
device_env profile.log
GPU_ARGS=(-- -ngl 99 -ngld 99 -fa on)
NCU_ARGS=(--ncu "$NCU" --skip "$SKIP" --count "$COUNT" --ncu-n-predict "$NCU_NPRED")
CTX=4096
# on any exit (a call's time limit included): the raw CSVs in one archive and the table of what was measured
NCU_DIR="" SMOKE_DIR=""
finish() {
  if [ -n "$NCU_DIR" ] && ls "$NCU_DIR"/ncu-*.csv > /dev/null 2>&1; then
    tar czf "$OUT/ncu-csv.tar.gz" -C "$NCU_DIR" $(cd "$NCU_DIR" && ls ncu-*.csv) || true
  fi
  if [ -n "$LABEL" ] && [ -s "$OUT/profile-$LABEL.jsonl" ]; then
    "$PY" -m study.profile_to_md "$OUT/profile-$LABEL.jsonl" > "$OUT/profile-$LABEL.md" || true
  fi
  [ -z "$SMOKE_DIR" ] || rm -rf "$SMOKE_DIR"
}
trap finish EXIT

if [ "$SMOKE" = 1 ]; then
  # everything but the GPU and ncu: the CPU engine, the known-answer pair, server timings only
  smoke_pair profile
  BUDGETS=${BUDGETS_SMOKE:-"1 3 7"} NPRED=32 REPS=2 CTX=512 LABEL=${LABEL:-smoke} SYNTH=0
  GPU_ARGS=() NCU_ARGS=(--no-ncu --threads 1)
else
  cuda_engine
  say "engine: $("$PY" -m dsparkcli.cli.app engine path)"
  command -v "$NCU" > /dev/null || [ -x "$NCU" ] || NCU=$(ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$NCU" ] || { echo "gpu_profile.sh: no ncu on this machine (give --ncu PATH)" >&2; exit 3; }
  NCU_ARGS[1]=$NCU
  say "ncu: $NCU ($("$NCU" --version 2>/dev/null | tail -1))"
  export DSPARK_LLAMA_BIN=${DSPARK_LLAMA_BIN:-$(dirname "$("$PY" -m dsparkcli.cli.app engine path)")}
fi

if [ -z "$TARGET" ]; then
  SYNTH=${SYNTH:-1} LABEL=${LABEL:-standin}
  standin_pair
  say "stand-in pair: $TARGET (SYNTHETIC acceptance L=$SYNTH)"
fi
[ "$PHASE" = prep ] && { say "phase prep done (engine and pair ready)"; exit 0; }
[ -n "$DRAFT" ] || { echo "gpu_profile.sh: give --target and --draft, or none for the stand-in" >&2; exit 2; }
LABEL=${LABEL:-real}
NCU_DIR=$WORK/ncu/$LABEL  # this label's raw CSVs only (a warm machine keeps $WORK between calls)
mkdir -p "$NCU_DIR"
SYNTH_ARGS=()
[ -n "$SYNTH" ] && [ "$SYNTH" != 0 ] && SYNTH_ARGS=(--synth-len "$SYNTH")

read -r -a BUDGET_ARGS <<< "$BUDGETS"
say "profile: plain + budgets $BUDGETS, $NPRED timed tokens${SYNTH_ARGS:+, SYNTHETIC L=$SYNTH}"
set +e
"$PY" -m study.gpu_profile --target "$TARGET" --draft "$DRAFT" --budgets "${BUDGET_ARGS[@]}" "${SYNTH_ARGS[@]}" \
  --n-predict "$NPRED" --reps "$REPS" --ctx "$CTX" "${NCU_ARGS[@]}" "${NO_PLAIN[@]}" --out "$OUT/profile-$LABEL.jsonl" --log-dir "$WORK/logs" \
  --csv-dir "$NCU_DIR" \
  "${GPU_ARGS[@]}" 2>&1 | tee -a "$LOG"
RC=${PIPESTATUS[0]}
set -e
finish
say "gpu_profile.py rc=$RC in $(( $(date +%s) - T0 )) s; table: $OUT/profile-$LABEL.md"
exit "$RC"
