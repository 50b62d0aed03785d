#!/usr/bin/env bash
# One GPU session in one go (issue 30.1): `fxopt doctor --device cuda`, `pytest -m gpu`, then
# the GPU check (benchmarks/gpu_check.py), each under its own time limit, so that the three
# fit one device command (9 minutes at most; the device tool allows 10 per command)
# and leave time in a 15-minute lease to run the check on.
#
# Everything lands under $OUT (the device tool's output folder; /tmp/gpu_session without
# one): session.txt (each step's command, limit, exit status and seconds), <step>.log,
# fxopt_doctor.json (written as each check ends), and benchmarks/results/gpu_check_<gpu>.md
# (written as each configuration ends). A step that fails or runs out of time does not stop
# the next one, and what a cut-off step wrote still comes back.
#
# The GPU check runs its configurations in priority order and one run reaches only the first
# ones. --continue [SECONDS] runs `fxopt calibrate --no-save` (45 s at most) and then the
# check, both within SECONDS (default 530), the check resuming: it keeps the rows the
# earlier run finished and runs the others. The device
# tool hands each command an empty $OUT, so the check also writes its file to .gpu_session/
# (git-ignored: the device keeps ignored paths between the commands of one lease), which is
# where --continue reads it from; failing that, from the checkout's
# benchmarks/results/gpu_check_<gpu>.md (copy the first run's file there first).
#
#   benchmarks/gpu_session.sh                 # from the repository root, on the GPU machine
#   benchmarks/gpu_session.sh --continue 240  # a second device command: the check goes on
#   benchmarks/gpu_session.sh --dry-run       # anywhere: print the plan, check the imports
#                                             # (--dry-run --continue: the second one's plan)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
KEEP=.gpu_session
DRY=0
CONTINUE=0
CONTINUE_S=530
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        --continue) CONTINUE=1 ;;
        [0-9]*) [ "$CONTINUE" = 1 ] || { echo "SECONDS goes after --continue" >&2; exit 2; }
                CONTINUE_S=$arg ;;
        *) echo "unknown argument: $arg (--dry-run, --continue [SECONDS])" >&2; exit 2 ;;
    esac
done
CALIBRATE_S=45
if [ "$CONTINUE_S" -lt $((60 + CALIBRATE_S)) ]; then
    echo "--continue $CONTINUE_S: calibrate and the check need at least $((60 + CALIBRATE_S)) s" >&2
    exit 2
fi
mkdir -p "$OUT/benchmarks/results" "$KEEP"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/fxopt-inductor-cache}
unset TRITON_INTERPRET
PYTHON=${PYTHON:-python}
LOG="$OUT/session.txt"
: > "$LOG"
# backend="fxopt" is found through an entry point, which an uninstalled checkout (the GPU
# machine's) lacks: declare it from pyproject.toml (nothing is written where it is found)
SITE=$("$PYTHON" benchmarks/declare_entry_point.py "$KEEP/site") || exit 1
if [ -n "$SITE" ]; then
    export PYTHONPATH="$PYTHONPATH:$SITE"
    echo "declared fxopt's torch_dynamo_backends entry point in $SITE" | tee -a "$LOG"
fi

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

RESULTS="$OUT/benchmarks/results"
if [ "$CONTINUE" = 1 ]; then
    # the earlier run's file: the lease's own copy, else one put in the checkout (a dated
    # file of an earlier session, gpu_check_<gpu>_<date>.md, is never taken)
    for earlier in benchmarks/results/gpu_check_*.md; do
        case "${earlier##*/gpu_check_}" in
            *_*) ;;  # gpu_check_<gpu>_<date>.md: committed by an earlier session
            *) cp "$earlier" "$RESULTS/" ;;
        esac
    done 2>/dev/null
    cp "$KEEP"/gpu_check_*.md "$RESULTS/" 2>/dev/null
    # this machine's rates (GEMMs, HBM, the link both ways, the host's fused AdamW, an
    # eager op's host cost): what the cost model's GPU rows are checked against (issue
    # 30.3/30.5); printed, not cached, so the check plans with the documented profile
    step calibrate $CALIBRATE_S "$PYTHON" -m fxopt calibrate --device cuda --no-save
    CHECK_S=$((CONTINUE_S - CALIBRATE_S))
    step gpu_check "$CHECK_S" "$PYTHON" benchmarks/gpu_check.py \
        --deadline-s $((CHECK_S - 30)) --resume --out-dir "$RESULTS" --also-to "$KEEP"
else
    # The doctor runs here with its report streamed, so pytest leaves out its doctor test
    step doctor 150 "$PYTHON" -m fxopt doctor --device cuda --json "$OUT/fxopt_doctor.json"
    step pytest_gpu 110 "$PYTHON" -m pytest -m gpu -v -p no:cacheprovider --durations=5 \
        --deselect tests/cli/test_doctor.py::test_every_doctor_check_passes_on_the_gpu
    step gpu_check 280 "$PYTHON" benchmarks/gpu_check.py --deadline-s 250 \
        --out-dir "$RESULTS" --also-to "$KEEP"
fi
echo "== done; results under $OUT" | tee -a "$LOG"
