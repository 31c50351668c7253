# Shell pieces shared by the device scripts (sourced by gpu_load.sh and gpu_profile.sh; needs REPO, WORK, say).

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
    say "no CUDA engine on this machine yet: scripts/gpu_study.sh --phase build"
    bash scripts/gpu_study.sh --phase build
  fi
}
