# Shell pieces shared by the device scripts (sourced by gpu_load.sh and gpu_profile.sh; needs REPO and T0).

# device_env LOG_NAME: $OUT (default ./gpu-out) and $WORK (DSPARK_STUDY_DIR) made, $LOG = $OUT/LOG_NAME, $PY
device_env() {
  OUT=${OUT:-$REPO/gpu-out}
  WORK=${DSPARK_STUDY_DIR:-/tmp/dspark-study}
  mkdir -p "$OUT" "$WORK"
  LOG=$OUT/$1
  PY=${PYTHON:-python3}
}
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }

# smoke_pair TAG: the CPU engine and the known-answer pair in a fresh temp folder, for a script's --cpu-smoke
# (sets PY, DSPARK_LLAMA_BIN, SMOKE_DIR, TARGET, DRAFT; the caller removes SMOKE_DIR)
smoke_pair() {
  PY=${PYTHON:-$REPO/.venv/bin/python}
  if [ -z "${DSPARK_LLAMA_BIN:-}" ]; then
    DSPARK_LLAMA_BIN=$(dirname "$("$PY" -m dsparkcli.cli.app engine path)") || { echo "no CPU engine: dspark engine build" >&2; exit 3; }
    export DSPARK_LLAMA_BIN
  fi
  SMOKE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dspark-$1-smoke.XXXXXX")
  "$PY" -m dsparkcli.cli.app synth "$SMOKE_DIR/pair" --accept-rate 0.7 --seed 5 > /dev/null
  TARGET=$SMOKE_DIR/pair/target-llama.gguf DRAFT=$SMOKE_DIR/pair/draft-dspark.gguf
}

# cuda_engine: this machine's CUDA engine under $WORK/cache (and the carried wheels on PYTHONPATH), built
# by gpu_study.sh --phase build when it is missing
cuda_engine() {
  export DSPARK_CACHE_DIR=$WORK/cache PYTHONPATH=$WORK/site:$REPO${PYTHONPATH:+:$PYTHONPATH}
  if ! "$PY" -m dsparkcli.cli.app engine path > /dev/null 2>&1; then
    say "no CUDA engine on this machine yet: study/gpu_study.sh --phase build"
    bash study/gpu_study.sh --phase build
  fi
}

# standin_pair: the full-width stand-in of the H200 study (qwen35moe Q4_K, draft Q8_0) from $MANIFEST, or the
# study's pair in $WORK/pair if this machine still has it, else written there (about 20 GB); sets TARGET, DRAFT
standin_pair() {
  [ -n "${MANIFEST:-}" ] || MANIFEST=$(ls "$WORK"/pair/manifest-*qwen35moe-Q4_K-dQ8_0.json 2>/dev/null | head -1 || true)
  if [ -z "$MANIFEST" ]; then
    say "writing the full-width stand-in pair into $WORK/pair"
    MANIFEST=$("$PY" -c "from dsparkcli.synth.full_width import write_full_width as w
print(w('$WORK/pair', qtype='Q4_K', draft_qtype='Q8_0', target_arch='qwen35moe').manifest)")
  fi
  read -r TARGET DRAFT < <("$PY" -c "import json, os; m = json.load(open('$MANIFEST')); d = os.path.dirname('$MANIFEST')
print(os.path.join(d, m['target']['file']), os.path.join(d, m['draft']['file']))")
}
