#!/usr/bin/env bash
# H200 performance study (issue 8), in ONE device call: build the CUDA engine with dspark, write the
# full-width synthetic pair while it compiles, run doctor (+ --selftest), then the SYNTHETIC-acceptance
# sweep (study/gpu_sweep.py) until a deadline, appending JSONL to $OUT as it goes.
#
# Needs .gpu/ from study/pack_gpu_bundle.py (carry [".gpu"]). Run from the repo root:
#   bash study/gpu_study.sh --quick                  # one call: build + pair + 256-token sweep
#   bash study/gpu_study.sh --part 2 --parts 2       # a second call: the other half of the grid
#   bash study/gpu_study.sh --phase build            # build + doctor + HBM only
#   bash study/gpu_study.sh --cpu-smoke              # here, on the CPU engine, scale 0.05 pair (< 3 min)
#
# Options: --quick (n_predict 256 only) --part N --parts M --qtype Q4_K|Q8_0 --draft-qtype Q8_0
#          --arch qwen35moe|qwen3moe --budget-s SECONDS (deadline for starting a config, default 550)
#          --scale S --with-cost (also L=1 at every budget) --phase all|build|sweep
#          --resume FILE.jsonl (skip configurations an earlier call measured; repeatable; a warm machine's
#                 earlier calls are always resumed from $WORK/history.jsonl, which every sweep record is mirrored to)
#          --n-predict "256 1024" (overrides --quick's 256)
#          --sweep-args "ARGS" (appended to gpu_sweep.py's arguments, e.g. a load-to-load replicate study:
#                 "--loads 2 --only L5.407-k5 L5.407-k7 --n-predict 256 --load-mode mmap")
#          --tune "ARGS" (instead of the sweep: study/tune_study.py ARGS on the pair, -ngl 99 -ngld 99 -fa on,
#                 records to $OUT/tune/; e.g. --tune "--lengths 3.501 5.098 5.407")
#          --kit (before the sweep: `dspark bench` on the prompt kit's text categories with the full-width
#                 pair, SYNTHETIC acceptance L=5, budgets 5 15, and the dspark-vs-bare-client overhead)
set -euo pipefail

T0=$(date +%s)
REPO=$(pwd)
PHASE=all QUICK="" PART=1 PARTS=1 QTYPE=Q4_K DQTYPE=Q8_0 ARCH=qwen35moe BUDGET_S=550 SCALE=1.0 SMOKE=0 COST=""
RESUME=() NPRED=() KIT=0 XARGS=() TUNE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --phase) PHASE=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --part) PART=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --qtype) QTYPE=$2; shift 2 ;;
    --draft-qtype) DQTYPE=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --budget-s) BUDGET_S=$2; shift 2 ;;
    --scale) SCALE=$2; shift 2 ;;
    --with-cost) COST=--with-cost; shift ;;
    --resume) RESUME+=(--resume "$2"); shift 2 ;;
    --n-predict) NPRED=(--n-predict $2); shift 2 ;;
    --cpu-smoke) SMOKE=1; shift ;;
    --kit) KIT=1; shift ;;
    --tune) TUNE=$2; shift 2 ;;
    --sweep-args) read -r -a XARGS <<< "$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_study.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

OUT=${OUT:-$REPO/gpu-out}
WORK=${DSPARK_STUDY_DIR:-/tmp/dspark-study}
# The device returns at most 8 files from $OUT: records go there directly (study.log, sweep.jsonl,
# bench-kit.jsonl, overhead.jsonl, BENCHMARKS.partial.md); every other log goes to $AUX and comes back
# as one aux.tar.gz, written on any exit (a timeout included).
AUX=$WORK/aux
mkdir -p "$OUT" "$WORK" "$AUX"
trap 'tar czf "$OUT/aux.tar.gz" -C "$WORK" aux 2>/dev/null || true' EXIT
# the CUDA build lands in its own cache: nothing else is found first (the smoke test uses the usual one)
[ "$SMOKE" = 1 ] || export DSPARK_CACHE_DIR=$WORK/cache
LOG=$OUT/study.log
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
PY=${PYTHON:-python3}

if [ "$SMOKE" = 1 ]; then
  # local check of everything but the CUDA build: the CPU engine, a scale-0.05 pair, a tiny grid
  PY=${PYTHON:-$REPO/.venv/bin/python}
  SCALE=0.05 QTYPE=Q8_0 DQTYPE=Q8_0 BUDGET_S=170
  if [ -z "${DSPARK_LLAMA_BIN:-}" ]; then
    DSPARK_LLAMA_BIN=$(dirname "$("$PY" -m dsparkcli.cli.app engine path)") || { echo "no CPU engine: dspark engine build" >&2; exit 3; }
    export DSPARK_LLAMA_BIN
  fi
  SWEEP_EXTRA=(--cpu --n-predict 48 --reps 2 --verify-reps 2 --budgets 2 3 5 --cost-n-predict 24 --categories general ocr --load-mode auto --no-overhead)
else
  SWEEP_EXTRA=(--load-mode probe)
fi
dspark() { "$PY" -m dsparkcli.cli.app "$@"; }

say "phase=$PHASE quick=${QUICK:-no} part=$PART/$PARTS qtype=$QTYPE draft=$DQTYPE arch=$ARCH scale=$SCALE smoke=$SMOKE"
{ nvidia-smi 2>/dev/null || echo "no nvidia-smi"; df -h "$WORK"; free -g; nproc; "$PY" --version; } > "$AUX/machine.txt" 2>&1 || true

# --- 1. wheels and dspark on PYTHONPATH (the GPU machine has no network)
[ -d .gpu/wheels ] || { echo "gpu_study.sh: .gpu/wheels missing: run study/pack_gpu_bundle.py and carry .gpu" >&2; exit 3; }
SITE=$WORK/site
if [ "$SMOKE" = 1 ]; then
  # the bundle is cp312; here we only prove it installs, and run with the project venv
  pip_t() { "$PY" -m pip install --quiet --no-index --no-deps --only-binary=:all: --python-version 3.12 --target "$SITE" .gpu/wheels/*.whl; }
else
  pip_t() { "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" .gpu/wheels/*.whl; }
fi
if ! pip_t > "$AUX/pip.log" 2>&1; then
  # no pip on the machine: a wheel is a zip whose contents pip --target would copy as they are
  for w in .gpu/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$SITE" || { cat "$AUX/pip.log"; exit 3; }; done
  say "pip failed ($(tail -1 "$AUX/pip.log")); wheels unzipped instead"
fi
[ "$SMOKE" = 1 ] || export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}
say "wheels installed into $SITE ($(ls .gpu/wheels | wc -l) wheels)"

# --- 2. llama.cpp source
# the default sdist's layout (xllamacpp-2026.10.11549/thirdparty/llama.cpp for b11549): dspark then knows the
# tree as the pinned one and names the build by its release (b11549-cuda-sm90-p...), not a path hash
SRC=$WORK/src/$("$PY" -c "from dsparkcli.llama.sources import DEFAULT_SDIST as s; print(f'{s.top}/{s.subdir}')")
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  mkdir -p "$(dirname "$SRC")" && tar xf .gpu/llama.cpp.tar.xz -C "$(dirname "$SRC")"
fi
say "source unpacked: $SRC"

# --- 3. the pair (background: disk-bound, runs while the build is CPU-bound)
PAIR_PID=""
if [ "$PHASE" != build ]; then
  NEED=$("$PY" -c "
from dsparkcli.synth import full_width as s
t, d = s.shapes_for(scale=$SCALE, target_arch='$ARCH')
print(sum(x.nbytes for x in s.target_tensors(t, '$QTYPE')) + sum(x.nbytes for x in s.draft_tensors(d, '$DQTYPE')))")
  FREE=$(df --output=avail -B1 "$WORK" | tail -1)
  if [ "$FREE" -lt $(( NEED + 3000000000 )) ]; then
    say "only $FREE bytes free for a $NEED-byte pair with $QTYPE; falling back to Q4_K"; QTYPE=Q4_K
  fi
  (
    "$PY" - <<EOF
import json, sys, time
from pathlib import Path
from dsparkcli.synth.full_width import write_full_width
# a warm machine keeps /tmp between calls: reuse a complete pair (the manifest is written last)
for m in sorted(Path("$WORK/pair").glob("manifest-*.json")):
    d = json.loads(m.read_text())
    same = (d["scale"], d["qtype"], d["draft_qtype"], d["target_arch"]) == ($SCALE, "$QTYPE", "$DQTYPE", "$ARCH")
    files = [m.parent / d["target"]["file"], m.parent / d["draft"]["file"]]
    if same and all(f.is_file() for f in files) and files[0].stat().st_size == d["target"]["bytes"]:
        print("reusing", m); print(m); sys.exit(0)
last = [0.0]
def prog(done, total, what):
    if time.monotonic() - last[0] > 10:
        last[0] = time.monotonic(); print(f"{done/1e9:.1f}/{total/1e9:.1f} GB {what}", flush=True)
p = write_full_width("$WORK/pair", scale=$SCALE, qtype="$QTYPE", draft_qtype="$DQTYPE", target_arch="$ARCH", on_progress=prog)
print(p.manifest)
EOF
  ) > "$AUX/pair.log" 2>&1 &
  PAIR_PID=$!
fi

# --- 4. HBM bandwidth (GPU idle during the build) and the CUDA build
HBM_PID=""
if [ "$SMOKE" = 0 ]; then
  # torch with the machine's own packages only (and dspark's stdlib-only modules): our wheels must not shadow
  # what torch was built with
  env PYTHONPATH="$REPO" "$PY" -m study.gpu_sweep --phase hbm --out "$OUT/sweep.jsonl" > "$AUX/hbm.log" 2>&1 &
  HBM_PID=$!
  B0=$(date +%s)
  if ! dspark engine build --backend cuda --cuda-arch 90 --source "$SRC" --jobs "$(nproc)" --json > "$AUX/build.json" 2> "$AUX/build.err"; then
    say "BUILD FAILED"; tail -50 "$AUX/build.err"; tail -80 "$DSPARK_CACHE_DIR"/engine/*/build.log > "$AUX/build.log.tail" 2>/dev/null || true
    exit 4
  fi
  say "engine built in $(( $(date +%s) - B0 )) s: $(cat "$AUX/build.json" | tr -d '\n' | cut -c1-300)"
fi

# --- 5. doctor
D0=$(date +%s); set +e; dspark doctor > "$AUX/doctor.txt" 2>&1; RC=$?; set -e
say "dspark doctor rc=$RC in $(( $(date +%s) - D0 )) s: $(tail -2 "$AUX/doctor.txt" | tr '\n' ' ')"
if dspark doctor --help 2>/dev/null | grep -q -- --selftest; then
  D0=$(date +%s); set +e; dspark doctor --selftest > "$AUX/selftest.txt" 2>&1; RC=$?; set -e
  say "dspark doctor --selftest rc=$RC in $(( $(date +%s) - D0 )) s: $(grep -E 'PASS|FAIL' "$AUX/selftest.txt" | head -3 | tr '\n' ' ')"
else
  say "dspark doctor has no --selftest in this tree"
fi
[ -n "$HBM_PID" ] && { wait "$HBM_PID" || say "hbm measurement failed: $(tail -3 "$AUX/hbm.log")"; }
[ "$PHASE" = build ] && { say "phase build done"; exit 0; }

# --- 6. wait for the pair, then sweep until the deadline
W0=$(date +%s)
wait "$PAIR_PID" || { say "PAIR WRITE FAILED"; cat "$AUX/pair.log"; exit 5; }
MANIFEST=$(tail -1 "$AUX/pair.log")
cp "$MANIFEST" "$AUX/"
say "pair ready (waited $(( $(date +%s) - W0 )) s): $(python3 -c "import json;m=json.load(open('$MANIFEST'));t=m['target'];print(t['file'],t['bytes'],'bytes',t['write_seconds'],'s',t['write_mb_per_s'],'MB/s')" 2>/dev/null)"

if [ "$KIT" = 1 ]; then
  # the prompt kit on the full-width pair (text categories: the synthetic target has no vision projector)
  TGT=$(python3 -c "import json,os;m=json.load(open('$MANIFEST'));print(os.path.join(os.path.dirname('$MANIFEST'),m['target']['file']))")
  DRF=$(python3 -c "import json,os;m=json.load(open('$MANIFEST'));print(os.path.join(os.path.dirname('$MANIFEST'),m['draft']['file']))")
  K0=$(date +%s); set +e
  dspark bench --target "$TGT" --draft "$DRF" --budget 5 15 --category text --limit 3 --reps 3 --warmup 1 \
    --n-predict 128 --ignore-eos --synth-len 5 --seed 1 --out "$OUT/bench-kit.jsonl" --format md \
    -- -ngl 99 -ngld 99 -fa on > "$AUX/bench-kit.md" 2> "$AUX/bench-kit.err"; RC=$?
  say "dspark bench (prompt kit, text, SYNTHETIC L=5) rc=$RC in $(( $(date +%s) - K0 )) s"
  "$PY" -m study.run_overhead --target "$TGT" --draft "$DRF" --budget 5 --reps 10 --n-predict 256 \
    --out "$OUT/overhead.jsonl" -- -ngl 99 -ngld 99 -fa on >> "$AUX/overhead.log" 2>&1 \
    && say "overhead: $(tail -1 "$AUX/overhead.log")" || say "overhead failed: $(tail -2 "$AUX/overhead.log")"
  set -e
fi

DEADLINE=$(( T0 + BUDGET_S ))
if [ -n "$TUNE" ]; then
  # issue 16: dspark tune vs a full grid, per acceptance length, in this run
  read -r -a TARGS <<< "$TUNE"
  TSERVER=(-- -ngl 99 -ngld 99 -fa on)
  [ "$SMOKE" = 1 ] && TSERVER=(--threads 2 --n-predict 32 --cost-n-predict 16 --grid-n-predict 32 --grid-reps 1 --budgets 1 2 3 5)
  set +e
  "$PY" -m study.tune_study --manifest "$MANIFEST" --out "$OUT/tune" --deadline "$DEADLINE" --tables-dir "$AUX/tables" "${TARGS[@]}" \
    "${TSERVER[@]}" 2>> "$AUX/tune.err" | tee -a "$LOG"; RC=${PIPESTATUS[0]}
  set -e
  say "tune study rc=$RC; done in $(( $(date +%s) - T0 )) s; results in $OUT/tune"
  exit "$RC"
fi
say "sweep: deadline in $(( DEADLINE - $(date +%s) )) s"
sweep() {
  "$PY" -m study.gpu_sweep --manifest "$1" --out "$OUT/sweep.jsonl" --deadline "$DEADLINE" \
    --part "$PART" --parts "$PARTS" $QUICK $COST "${NPRED[@]}" "${RESUME[@]}" "${SWEEP_EXTRA[@]}" "${XARGS[@]}" \
    --mirror "$WORK/history.jsonl" --resume "$WORK/history.jsonl" \
    --log-dir "$WORK/logs" >> "$AUX/sweep.log" 2>&1
}
set +e
sweep "$MANIFEST"; RC=$?
if [ "$RC" = 6 ] && [ "$ARCH" = qwen35moe ]; then
  # the hybrid target would not even serve plain decoding here: fall back to the plain-attention stand-in
  say "qwen35moe plain baseline failed ($(grep -m1 error "$AUX/sweep.log" | cut -c1-200)); writing a qwen3moe pair"
  rm -f "$WORK"/pair/target-*qwen35moe*.gguf
  "$PY" -c "from dsparkcli.synth.full_width import write_full_width as w; print(w('$WORK/pair', scale=$SCALE, qtype='$QTYPE', draft_qtype='$DQTYPE', target_arch='qwen3moe').manifest)" > "$AUX/pair3.log" 2>&1
  MANIFEST=$(tail -1 "$AUX/pair3.log"); cp "$MANIFEST" "$AUX/" 2>/dev/null
  sweep "$MANIFEST"; RC=$?
fi
set -e
say "sweep rc=$RC: $(grep -c '"type": "config"' "$OUT/sweep.jsonl" 2>/dev/null) configs, $(grep -c '"type": "error"' "$OUT/sweep.jsonl" 2>/dev/null) errors"
[ "$RC" = 0 ] || tail -30 "$AUX/sweep.log"
tail -c 20000 "$WORK"/logs/*.log > "$AUX/server-logs.tail" 2>/dev/null || true

# --- 7. tables from the records (the lead regenerates BENCHMARKS.md from the committed JSONL)
"$PY" -m study.bench_to_md "$OUT/sweep.jsonl" > "$OUT/BENCHMARKS.partial.md" 2> "$AUX/bench_to_md.err" || say "bench_to_md failed: $(tail -3 "$AUX/bench_to_md.err")"
say "done in $(( $(date +%s) - T0 )) s; results in $OUT"
