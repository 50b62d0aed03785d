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
# The GPU check runs its configurations in priority order and one run reaches only the first
# ones. --continue runs the check alone, resuming: it keeps the rows of the results file in
# the checkout's benchmarks/results/ (copy the first run's file there before the second
# device command) and runs the configurations not yet run, under a longer deadline.
#
#   benchmarks/gpu_session.sh             # from the repository root, on the GPU machine
#   benchmarks/gpu_session.sh --continue  # a second device command: the check goes on
#   benchmarks/gpu_session.sh --dry-run   # anywhere: print the plan, check the imports
#                                         # (--dry-run --continue: the second one's plan)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
DRY=0
CONTINUE=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        --continue) CONTINUE=1 ;;
        *) echo "unknown argument: $arg (--dry-run, --continue)" >&2; exit 2 ;;
    esac
done
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

if [ "$CONTINUE" = 1 ]; then
    cp benchmarks/results/gpu_check_*.md "$OUT/benchmarks/results/" 2>/dev/null
    step gpu_check 530 "$PYTHON" benchmarks/gpu_check.py --deadline-s 500 --resume \
        --out-dir "$OUT/benchmarks/results"
else
    step doctor 90 "$PYTHON" -m fxopt doctor --device cuda
    step pytest_gpu 105 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider
    step gpu_check 335 "$PYTHON" benchmarks/gpu_check.py --deadline-s 305 \
        --out-dir "$OUT/benchmarks/results"
fi
if [ "$DRY" = 0 ]; then
    cp "$OUT"/benchmarks/results/gpu_check_*.md benchmarks/results/ 2>/dev/null
fi
echo "== done; results under $OUT" | tee -a "$LOG"
