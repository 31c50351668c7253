#!/usr/bin/env bash
# `make demo`: the main job end to end on the embedded synthetic pair, CPU engine, no model download.
# Every number printed here comes from the real llama-server; the synthetic pair makes them predictable.
set -euo pipefail
cd "$(dirname "$0")/.."
DSPARK=${DSPARK:-.venv/bin/dspark}
OUT=${DEMO_OUT:-demo-out}
rm -rf "$OUT"
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/4  dspark doctor: which llama.cpp, and can it run DSpark drafts?"
$DSPARK doctor

step "2/4  dspark synth: a tiny known-answer vision pair (target + DSpark draft + mmproj + PNG)"
$DSPARK synth "$OUT/pair" --vision --accept-rate 0.7 --seed 7
P="$OUT/pair"

step "3/4  dspark run: image + prompt, streamed answer, acceptance statistics"
echo "(the synthetic tokenizer prints token ids in hex; the real pair prints words)"
$DSPARK run "$P/image.png" "What is in this image?" \
  --target "$P/target-llama.gguf" --draft "$P/draft-dspark.gguf" --mmproj "$P/mmproj-mlp.gguf" \
  --budget 5 --max-tokens 64 --ctx 2048 -t 2
$DSPARK run "$P/image.png" "What is in this image?" \
  --target "$P/target-llama.gguf" --draft "$P/draft-dspark.gguf" --mmproj "$P/mmproj-mlp.gguf" \
  --budget 5 --max-tokens 64 --ctx 2048 -t 2 --json > "$OUT/run.json"
echo "record written: $OUT/run.json"

step "4/4  dspark bench: plain vs budgets 3 and 7, same prompts, identity to plain decoding"
echo "(a 1 MB toy model decodes at thousands of tok/s, so drafting overhead dominates its speed here;"
echo " what the toy shows exactly is drafted/accepted/identity. Real-scale speedups: BENCHMARKS.md)"
$DSPARK bench --target "$P/target-llama.gguf" --draft "$P/draft-dspark.gguf" --mmproj "$P/mmproj-mlp.gguf" \
  --budget 3 7 --category general --category ocr --limit 4 --reps 2 --warmup 1 --n-predict 48 --ctx 2048 \
  --out "$OUT/bench.jsonl" -- -t 2

cat <<'NEXT'

== Next, with a GPU and the real MiniCPM-V-4.7-35B-A3B pair:
  dspark engine build --backend cuda --cuda-arch 90      # ~5 min on 16 cores
  dspark fetch minicpm-v-4.7                             # target + mmproj + draft, sha256-verified
  dspark run photo.png "Describe this picture" --model minicpm-v-4.7 -- -ngl 99 -ngld 99 -fa on
  dspark bench --model minicpm-v-4.7 --budget 5 15 --reps 3 --plot bench.png -- -ngl 99 -ngld 99 -fa on
NEXT
