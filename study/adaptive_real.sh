#!/usr/bin/env bash
# Issue 20 on a real pair (e.g. SmolLM2-135M + its distilled DSpark draft, `dspark fetch smollm2-135m`):
# `dspark tune --adaptive` on the kit's text categories (the cost table, the static picks and the adaptive
# budget measured side by side), then `dspark bench` with plain, fixed budgets and `--budget adaptive` on
# one server each: per category, and all categories interleaved on one server (the bench's "all" rows).
# Thin client of the dspark CLI; needs dspark's patched engine (`dspark engine build`, the default).
#
#   bash study/adaptive_real.sh TARGET.gguf DRAFT.gguf [OUT_DIR]     # OUT_DIR defaults to $OUT or ./adaptive-real
#   THREADS=1 LIMIT=2 N=64 REPS=2 BUDGETS="1 2 3" bash study/adaptive_real.sh ...   # the CPU
#   (env: LIMIT N REPS THREADS BUDGETS SERVER_ARGS; GPU flags -ngl 99 -ngld 99 -fa on when nvidia-smi is there)
#
# Writes OUT_DIR/: tune.json (the tuning record: candidates and "adaptive" measured per category),
# tune.jsonl, cost-table.txt, bench.json (summaries), bench.jsonl (every record), adaptive.log.
set -euo pipefail
TARGET=${1:?usage: adaptive_real.sh TARGET.gguf DRAFT.gguf [OUT_DIR]}
DRAFT=${2:?usage: adaptive_real.sh TARGET.gguf DRAFT.gguf [OUT_DIR]}
DIR=${3:-${OUT:-$PWD/adaptive-real}}
LOG=$DIR/adaptive.log
# shellcheck source=real_pair_env.sh
source "$(dirname "$0")/real_pair_env.sh"
read -r -a BUDGETS <<< "${BUDGETS:-1 2 3 5 7}"

T0=$(date +%s)
dspark tune --target "$TARGET" --draft "$DRAFT" --category text --limit "${LIMIT:-3}" --n-predict "${N:-128}" \
  --reps "${REPS:-2}" --budgets "${BUDGETS[@]}" "${CTX[@]}" --adaptive --out "$DIR/tune.jsonl" \
  --record "$DIR/tune.json" --cost-table "$DIR/cost-table.txt" --remeasure-cost "${PASS[@]}" 2>&1 | tee -a "$LOG"
say "tune --adaptive: $(( $(date +%s) - T0 )) s wall"

T1=$(date +%s)
dspark bench --target "$TARGET" --draft "$DRAFT" --category text --limit "${LIMIT:-3}" \
  --budget "${BUDGETS[@]}" adaptive --reps "${REPS:-2}" -n "${N:-128}" "${CTX[@]}" --json --out "$DIR/bench.jsonl" \
  "${PASS[@]}" > "$DIR/bench.json" 2>> "$LOG"
say "bench plain, ${BUDGETS[*]}, adaptive: $(( $(date +%s) - T1 )) s; all in $(( $(date +%s) - T0 )) s"
"$PY" - "$DIR/bench.json" <<'EOF' | tee -a "$LOG"
import json, sys
rows = json.load(open(sys.argv[1]))["summaries"]
cats = sorted({r["category"] for r in rows}, key=lambda c: (c == "all", c))
confs = list(dict.fromkeys(r["config"] for r in rows))
cell = {(r["config"], r["category"]): r for r in rows}
print("speedup vs plain   " + "  ".join(f"{c:>12}" for c in cats))
for conf in confs:
    print(f"{conf:18} " + "  ".join(f"{(cell.get((conf, c)) or {}).get('speedup') or 1.0:12.3f}" for c in cats))
EOF
