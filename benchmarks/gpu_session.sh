#!/usr/bin/env bash
# One GPU session in one go (issue 30.1): `fxopt doctor --device cuda`, `pytest -m gpu`, then
# the GPU check (benchmarks/gpu_check.py), each under its own time limit, so that the three
# fit one device command (9 minutes at most; the device tool allows 10 per command)
# and leave time in a 15-minute lease to run it again.
#
# Everything lands under $OUT (the device tool's output folder; /tmp/gpu_session without
# one): session.txt (each step's command, limit, exit status and seconds), <step>.log, and
# benchmarks/results/gpu_check_<gpu>.md, also copied to the checkout's benchmarks/results/.
# A step that fails or runs out of time does not stop the next one; the GPU check writes
# its rows as they come, so a cut-off run still returns them.
#
#   benchmarks/gpu_session.sh            # from the repository root, on the GPU machine
#   benchmarks/gpu_session.sh --dry-run  # anywhere: print the plan, check the imports
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
mkdir -p "$OUT/benchmarks/results" benchmarks/results
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/fxopt-inductor-cache}
unset TRITON_INTERPRET
PYTHON=${PYTHON:-python}
LOG="$OUT/session.txt"
: > "$LOG"

step() {  # step NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s): $*" | tee -a "$LOG"
    if [ "$DRY" = 1 ]; then
        echo "   dry run: not started" | tee -a "$LOG"
        return 0
    fi
    local begin=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "   exit $rc after $((SECONDS - begin)) s$([ $rc = 124 ] && echo ' (time limit)')" \
        | tee -a "$LOG"
    tail -n 15 "$OUT/$name.log"
}

"$PYTHON" -c "import torch, fxopt, transformers; print('torch', torch.__version__, \
'cuda', torch.cuda.is_available(), 'fxopt', fxopt.__file__)" 2>&1 | tee -a "$LOG"
[ "$DRY" = 1 ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
    2>&1 | tee -a "$LOG"

step doctor 90 "$PYTHON" -m fxopt doctor --device cuda
step pytest_gpu 105 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider
step gpu_check 335 "$PYTHON" benchmarks/gpu_check.py --deadline-s 305 \
    --out-dir "$OUT/benchmarks/results"
if [ "$DRY" = 0 ]; then
    cp "$OUT"/benchmarks/results/gpu_check_*.md benchmarks/results/ 2>/dev/null
fi
echo "== done; results under $OUT" | tee -a "$LOG"
