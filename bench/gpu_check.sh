#!/usr/bin/env bash
# The executor's GPU paths (NCCL, CUDA-event timing, CUDA memory) and the simulator calibrated on
# GPU timings, checked in one run of a few minutes (README, "GPU check"):
#
#   bench/gpu_check.sh [OUT]          (default runs/gpu_check; PYTHON=... picks the interpreter)
#
# On a machine with N >= 1 GPUs, W = min(N, 4):
#   1. world size 1, --check: interleaved with 2 stages on one GPU, and zbv's program (2 stages, split
#      backward) from a --program file;
#   2. N >= 2: gpipe, 1f1b, interleaved (v=2) and zb-h1 at world size W on NCCL, --check;
#   3. a calibration run (interleaved v=2, --profile-layers, --profile-p2p when W >= 2), then
#      `sim calibrate`; two held-out runs of other programs at the same microbatch size (gpipe and
#      1f1b at twice m; at W = 1 looped-bfs v=4 and interleaved at twice m) and `sim compare
#      --measured` on each, `sim plot --run --overlay` of each;
#   4. the report (bench/gpu_check_report.py): GPU model, torch/CUDA/NCCL versions, check errors,
#      prediction errors, peak torch.cuda.max_memory_allocated per rank against the simulator's
#      peak (sim/device_memory.py). Everything lands under OUT; exit 0 if every step ran and
#      every check passed.
# Without a GPU the same steps run on gloo at world size 2 with small sizes (the CPU fallback that
# the tests run). GPU_CHECK_WORLD overrides W (at most N on GPUs); GPU_CHECK_BUDGET (default 450 s)
# bounds the steps' time in all: each step gets at most LIMIT seconds and what is left of it.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-runs/gpu_check}
PY=${PYTHON:-python}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT/runs" "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/compare-*.json "$OUT"/overlay-*.png "$OUT/calibration.json" "$OUT"/logs/*.log
: > "$OUT/steps.tsv"
START=$EPOCHREALTIME

N=$("$PY" "$ROOT/bench/gpu_check_report.py" env "$OUT/env.json") || { echo "gpu_check: error: cannot probe the machine with $PY" >&2; exit 2; }
if [ "$N" -ge 1 ]; then
    W=${GPU_CHECK_WORLD:-$(( N < 4 ? N : 4 ))}
    if [ "$W" -gt "$N" ]; then echo "gpu_check: error: GPU_CHECK_WORLD=$W but only $N GPUs" >&2; exit 2; fi
    CHECK_MODEL=(--model gpt --layers 8 --hidden 128 --heads 4 --seq-len 64 --vocab 256)
    CHECK_ROWS=4
    CHECK_STEPS=(--steps 2 --warmup 1)
    TIME_MODEL=(--model mlp --layers 8 --hidden 4096)
    TIME_ROWS=512
    TIME_STEPS=(--steps 20 --warmup 3)
    LIMIT=150
else
    W=${GPU_CHECK_WORLD:-2}
    export OMP_NUM_THREADS=1
    CHECK_MODEL=(--model gpt --layers 4 --hidden 16 --heads 2 --seq-len 8 --vocab 32)
    CHECK_ROWS=2
    CHECK_STEPS=(--steps 1 --warmup 0)
    TIME_MODEL=(--model mlp --layers 4 --hidden 64)
    TIME_ROWS=4
    TIME_STEPS=(--steps 4 --warmup 1)
    LIMIT=120
fi
echo "gpu_check: $N GPU(s), world size $W, writing $OUT"

BUDGET=${GPU_CHECK_BUDGET:-450}  # seconds for all steps: a hung step must not eat a lent machine's time

# step NAME ROLE COMMAND...: run it with a time limit (LIMIT, and what is left of BUDGET), output to
# logs/NAME.log, one line in steps.tsv (exit code -1: not run, the budget was spent).
step() {
    local name=$1 role=$2 t0=$EPOCHREALTIME code seconds left
    shift 2
    left=$(awk "BEGIN { printf \"%d\", $BUDGET - ($EPOCHREALTIME - $START) }")
    if [ "$left" -lt 10 ]; then
        echo "not run: the ${BUDGET} s budget is spent" > "$OUT/logs/$name.log"
        code=-1
    else
        timeout --kill-after=10 $(( left < LIMIT ? left : LIMIT )) "$@" > "$OUT/logs/$name.log" 2>&1
        code=$?
    fi
    seconds=$(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $t0 }")
    printf '%s\t%s\t%s\t%s\n' "$name" "$role" "$code" "$seconds" >> "$OUT/steps.tsv"
    printf "  %-32s exit %3d  %6s s\n" "$name" "$code" "$seconds"
}

# execute NAME ROLE RANKS BATCH ARGS...: one executor run into runs/NAME (one rank: without torchrun).
execute() {
    local name=$1 role=$2 ranks=$3 batch=$4 launch
    shift 4
    launch=(-m torch.distributed.run --standalone --nproc-per-node "$ranks")
    [ "$ranks" -eq 1 ] && launch=()
    rm -rf "$OUT/runs/$name"
    step "$name" "$role" "$PY" "${launch[@]}" -m runtime --batch-size "$batch" "$@" --out "$OUT/runs/$name"
}

# One GPU: several stages on one rank, from a schedule and from a program file (I/W split, V placement).
execute p1-interleaved check 1 $(( 4 * CHECK_ROWS )) --schedule interleaved --chunks 2 --microbatches 4 \
    "${CHECK_MODEL[@]}" "${CHECK_STEPS[@]}" --check
"$PY" -c 'import sys, schedules; schedules.save_json(schedules.lower(schedules.build("zbv", ranks=1, microbatches=4)), sys.argv[1])' \
    "$OUT/zbv-p1.json"
execute p1-zbv-program check 1 $(( 4 * CHECK_ROWS )) --program "$OUT/zbv-p1.json" "${CHECK_MODEL[@]}" \
    "${CHECK_STEPS[@]}" --check
if [ "$W" -ge 2 ]; then
    for schedule in gpipe 1f1b interleaved zb-h1; do
        chunks=()
        [ "$schedule" = interleaved ] && chunks=(--chunks 2)
        execute "check-$schedule" check "$W" $(( 2 * W * CHECK_ROWS )) --schedule "$schedule" "${chunks[@]}" \
            --microbatches $(( 2 * W )) "${CHECK_MODEL[@]}" "${CHECK_STEPS[@]}" --check
    done
fi

p2p=()
[ "$W" -ge 2 ] && p2p=(--profile-p2p)
m=$(( W >= 2 ? 2 * W : 4 ))
run() {  # run NAME ROLE MICROBATCHES ARGS...: a timing run of the timing model, m x TIME_ROWS samples
    local name=$1 role=$2 mb=$3
    shift 3
    execute "$name" "$role" "$W" $(( mb * TIME_ROWS )) --microbatches "$mb" "$@" "${TIME_MODEL[@]}" "${TIME_STEPS[@]}"
}
run calib-interleaved calibrate "$m" --schedule interleaved --chunks 2 --profile-layers "${p2p[@]}"
if [ "$W" -ge 2 ]; then
    run heldout-gpipe heldout "$m" --schedule gpipe
    run heldout-1f1b heldout $(( 2 * m )) --schedule 1f1b
    HELDOUT=(heldout-gpipe heldout-1f1b)
else
    run heldout-looped-bfs heldout "$m" --schedule looped-bfs --chunks 4
    run heldout-interleaved heldout $(( 2 * m )) --schedule interleaved --chunks 2
    HELDOUT=(heldout-looped-bfs heldout-interleaved)
fi

CAL="$OUT/calibration.json"
step sim-calibrate sim "$PY" -m sim calibrate "$OUT/runs/calib-interleaved" -o "$CAL"
for name in "${HELDOUT[@]}"; do
    step "sim-compare-$name" sim sh -c '"$0" -m sim compare --measured "$1" --costs "$2" --json > "$3"' \
        "$PY" "$OUT/runs/$name" "$CAL" "$OUT/compare-$name.json"
    step "sim-plot-$name" sim "$PY" -m sim plot --run "$OUT/runs/$name" --overlay --costs "$CAL" \
        -o "$OUT/overlay-$name.png"
done

echo
"$PY" "$ROOT/bench/gpu_check_report.py" report "$OUT"
code=$?
echo "gpu_check: $(awk "BEGIN { printf \"%.0f\", $EPOCHREALTIME - $START }") s in all"
exit $code
