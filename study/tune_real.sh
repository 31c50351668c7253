#!/usr/bin/env bash
# Issue 16 on a real pair (e.g. SmolLM2-135M Q4_1 + its distilled DSpark draft): `dspark tune` on the text
# categories, then `--budget auto` through run, serve and bench. Thin client of the dspark CLI; the same
# commands on the CPU and on the H200 (the GPU flags only when nvidia-smi is there, or set SERVER_ARGS).
#
#   bash study/tune_real.sh TARGET.gguf DRAFT.gguf [OUT_DIR]      # OUT_DIR defaults to $OUT or ./tune-real
#   THREADS=1 LIMIT=2 N=64 REPS=2 bash study/tune_real.sh ...        # the CPU (env: LIMIT N REPS THREADS SERVER_ARGS)
#
# Writes OUT_DIR/: tune.json (the tuning record, predicted vs measured per category), tune.jsonl (every bench
# record), cost-table.txt (per-k step costs), run.json, serve.json, bench.json, tune.log (what was printed).
set -euo pipefail
TARGET=${1:?usage: tune_real.sh TARGET.gguf DRAFT.gguf [OUT_DIR]}
DRAFT=${2:?usage: tune_real.sh TARGET.gguf DRAFT.gguf [OUT_DIR]}
DIR=${3:-${OUT:-$PWD/tune-real}}
LOG=$DIR/tune.log
# shellcheck source=real_pair_env.sh
source "$(dirname "$0")/real_pair_env.sh"

T0=$(date +%s)
dspark tune --target "$TARGET" --draft "$DRAFT" --category text --limit "${LIMIT:-3}" --n-predict "${N:-128}" \
  --reps "${REPS:-2}" "${CTX[@]}" --out "$DIR/tune.jsonl" --record "$DIR/tune.json" \
  --cost-table "$DIR/cost-table.txt" --remeasure-cost "${PASS[@]}" 2>&1 | tee -a "$LOG"
say "tune: $(( $(date +%s) - T0 )) s wall"

dspark run --target "$TARGET" --draft "$DRAFT" "Explain in two sentences why the sky is blue." -n 64 \
  --budget auto --p-min auto "${CTX[@]}" --json "${PASS[@]}" > "$DIR/run.json" 2>> "$LOG"
say "run --budget auto: $(grep -o '"budget": [0-9]*' "$DIR/run.json")"

# serve prints its JSON once the server is up; stop it by its own pid (SIGTERM: a background job ignores SIGINT).
# The python process itself goes to the background, not the `dspark` function: a function's $! is a subshell,
# and killing that left serve (and its llama-server) running
"$PY" -m dsparkcli.cli.app serve --target "$TARGET" --draft "$DRAFT" --budget auto --p-min auto --port 0 "${CTX[@]}" --json \
  "${PASS[@]}" > "$DIR/serve.json" 2>> "$LOG" &
SERVE=$!
for _ in $(seq 1 120); do grep -q '"budget"' "$DIR/serve.json" 2>/dev/null && break; sleep 0.5; done
kill -TERM "$SERVE" 2>/dev/null || true
wait "$SERVE" 2>/dev/null || true
say "serve --budget auto: $(grep -o '"budget": [0-9]*' "$DIR/serve.json")"

dspark bench --target "$TARGET" --draft "$DRAFT" --category text --limit "${LIMIT:-3}" --budget auto 5 \
  --reps "${REPS:-2}" -n "${N:-128}" "${CTX[@]}" --json --out "$DIR/bench.jsonl" "${PASS[@]}" \
  > "$DIR/bench.json" 2>> "$LOG"
say "bench --budget auto 5: done; all in $(( $(date +%s) - T0 )) s"
