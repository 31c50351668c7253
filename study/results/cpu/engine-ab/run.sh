#!/bin/bash
# CPU A/B: does the patch series since 0002 change a budget-1 step of the REAL pair?
cd /work/main
E=$HOME/.cache/dspark/engine
for round in 1 2; do
for key in p14d90a1c p44da5a80 p39f9a68c; do
  .venv/bin/dspark bench --model smollm2-135m --category code --limit 4 --reps 2 --n-predict 96 --budget 1 \
    --llama-bin $E/0c1e570-cpu-x86-64-v3-rpc-$key/build/bin --json --out /tmp/ab/ab-$key-$round.jsonl -- -t 2 > /tmp/ab/ab-$key-$round.json 2>/tmp/ab/err-$key-$round
done; done
echo done > /tmp/ab/DONE
