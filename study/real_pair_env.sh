# Sourced by study/tune_real.sh and study/adaptive_real.sh (after TARGET, DRAFT, DIR and LOG are set):
# the llama-server flags (GPU ones when nvidia-smi is there, or SERVER_ARGS), the -c/-t every command shares
# (both are part of the tuning key), and the dspark / say helpers.
mkdir -p "$DIR"
PY=${PYTHON:-python3}
if [ -z "${SERVER_ARGS+x}" ]; then
  if command -v nvidia-smi > /dev/null 2>&1; then SERVER_ARGS="-ngl 99 -ngld 99 -fa on"; else SERVER_ARGS=""; fi
fi
read -r -a SARGS <<< "$SERVER_ARGS"
PASS=(); if [ ${#SARGS[@]} -gt 0 ]; then PASS=(-- "${SARGS[@]}"); fi
CTX=(--ctx 4096)  # the same -c everywhere: it is part of the tuning key (bench's default is 4096)
# on a CPU shared with other work, one llama-server thread (-t is part of the key too): its spinning
# thread pool is slowed badly when every core is oversubscribed
if [ -n "${THREADS:-}" ]; then CTX+=(--threads "$THREADS"); fi
dspark() { "$PY" -m dsparkcli.cli.app "$@"; }
say() { echo "$*" | tee -a "$LOG"; }
