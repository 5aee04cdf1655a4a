#!/usr/bin/env bash
# Issue 10's GPU checks in one command, for a machine lent by the device tool (its Python holds torch and
# reaches no package index). Here first: `.venv/bin/python scripts/gpu_kit.py` (detq's other dependencies
# as wheels, in .whl); then a device run from the repository's root, carrying them:
#
#   command "bash scripts/gpu_session.sh", carry [".whl"], timeout_s 420
#
# It installs the wheels beside the image's packages, then runs, each under its own time limit so that one
# that hangs leaves the others their time: the GPU pool on the demo model (CUDA-saved, detections against
# the CPU pool's), on SSDlite photos (images/s, GPU busy %), and nvJPEG against the pool's own decode at
# 1280x960 and 12 MP (scripts/gpu_decode_probe.py). Each check's JSON, the GPU workers' logs, nvidia-smi's
# view and this script's log land in $OUT (8 files: what the device tool brings back). Exits 0 when
# every check passed.
#
# --rehearse-on-cpu runs the same steps on the CPU pool, small, with PYTHON (default python3) and WHEELS
# (default .whl): a bare interpreter with torch, the wheels and this script show here that the kit is
# complete before a GPU's minutes are spent on it.
set -uo pipefail
cd "$(dirname "$0")/.."

rehearse=()
demo_images=256 ssdlite_images=512 photos=128 large_photos=32
if [ "${1:-}" = "--rehearse-on-cpu" ]; then
    rehearse=(--rehearse-on-cpu)
    demo_images=12 ssdlite_images=16 photos=8 large_photos=2
fi
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-.whl}"
OUT="${OUT:-$(mktemp -d)}"
LOG="$OUT/session.log"
mkdir -p "$OUT"

site="$(mktemp -d)"
if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$WHEELS"/*.whl >>"$LOG" 2>&1; then
    echo "gpu_session: the wheels in $WHEELS did not install (see $LOG)" | tee -a "$LOG" >&2
    exit 1
fi
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1

failed=0
check() {  # name, seconds, command...: its stdout to $OUT/name.json, its stderr to the log
    local name=$1 seconds=$2
    shift 2
    echo "gpu_session: $name ($(date -u +%T))" | tee -a "$LOG" >&2
    timeout "$seconds" "$@" >"$OUT/$name.json" 2>>"$LOG"
    local code=$?
    if [ "$code" -ne 0 ]; then
        echo "gpu_session: $name failed (exit $code; 124: over its $seconds s)" | tee -a "$LOG" >&2
        failed=1
    fi
}

if [ ${#rehearse[@]} -eq 0 ]; then
    nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
fi
check smoke_demo 120 "$PYTHON" scripts/gpu_smoke.py "${rehearse[@]}" --model demo \
    --images "$demo_images" --out "$OUT/demo"
check smoke_ssdlite 150 "$PYTHON" scripts/gpu_smoke.py "${rehearse[@]}" --model ssdlite \
    --images "$ssdlite_images" --batch-size 64 --micro-batch 32 --out "$OUT/ssdlite"
check decode_1280x960 45 "$PYTHON" scripts/gpu_decode_probe.py "${rehearse[@]}" --images "$photos"
check decode_4000x3000 60 "$PYTHON" scripts/gpu_decode_probe.py "${rehearse[@]}" \
    --images "$large_photos" --size 4000x3000
echo "gpu_session: done, $([ $failed -eq 0 ] && echo 'every check passed' || echo 'a check failed'); in $OUT" |
    tee -a "$LOG" >&2
exit $failed
