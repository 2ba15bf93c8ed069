#!/usr/bin/env bash
# One device check, for a machine with a GPU and nothing prepared (under 10 minutes):
#   1. installs what the project needs (.ci/setup, the opencl and vulkan extras, the Vulkan and
#      OpenCL loaders with apt when they are missing; the GPU's own driver must be there)
#   2. lists the devices (mnnllm backends --json)
#   3. per available backend: the conformance suite (mnnllm test-backend NAME --json) and its
#      kernel tests (tests/test_NAME.py, tests/test_replay.py; for the torch plugin, when it is
#      installed with torch: tests/test_torch_replay.py, whose CUDA test captures a graph)
#   4. the host-time benchmark (bench/host_time.py, replay off and on)
#   5. mnnllm bench on each backend: the shared model, then the 1.7B shape of bench/model_scale.py
# and writes every result (JSON, logs) and summary.md into one folder.
#
#   bash bench/device_check.sh [OUT_DIR]      # default: device-check-<UTC time>
#   QUICK=1 bash bench/device_check.sh        # small sizes, no 1.7B model (a CPU-only dry run)
#   SKIP_SETUP=1 ...                          # use the .venv as it is
#   BACKENDS=opencl,vulkan ...                # instead of every available backend
# Every step has its own time limit and failing steps do not stop the others; the exit
# status is 1 when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-device-check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
QUICK=${QUICK:-0}
PY=.venv/bin/python
MODEL=${MODEL:-../shared/models/smollm2-135m-instruct-mnn-q4/config.json}
STATUS="$OUT/steps.tsv"
: > "$STATUS"
started=$(date +%s)

step() {  # step NAME LIMIT_S command...: stdout to NAME.out (or the file the command writes), stderr to NAME.err
  local name=$1 limit=$2
  shift 2
  local begin=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - begin ))" >> "$STATUS"
  echo "device-check: $name rc=$rc ($(( $(date +%s) - begin )) s)" >&2
  return 0
}

if [ "${SKIP_SETUP:-0}" != 1 ]; then
  if command -v apt-get >/dev/null 2>&1 && { ! ldconfig -p | grep -q libvulkan.so.1 || ! ldconfig -p | grep -q libOpenCL.so.1; }; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    step apt 180 sh -c "$SUDO apt-get update -qq && $SUDO apt-get install -y -q --no-install-recommends libvulkan1 ocl-icd-libopencl1"
  fi
  step setup 300 sh -c 'bash .ci/setup && .venv/bin/python -m pip --disable-pip-version-check install -e ".[opencl,vulkan]"'
fi

step backends 120 .venv/bin/mnnllm backends --json
cp "$OUT/backends.out" "$OUT/backends.json" 2>/dev/null
if [ -n "${BACKENDS:-}" ]; then
  LIST=${BACKENDS//,/ }
else
  LIST=$($PY -c 'import json, sys; print(" ".join(b["name"] for b in json.load(open(sys.argv[1]))["backends"] if b["available"]))' "$OUT/backends.json" 2>/dev/null)
fi
echo "device-check: backends: ${LIST:-none}" >&2

GPU_LIST=""
for name in $LIST; do
  step "conformance-$name" 240 .venv/bin/mnnllm test-backend "$name" --json
  if [ -f "tests/test_$name.py" ]; then
    step "kernel-tests-$name" 300 $PY -m pytest -x -q -p no:cacheprovider "tests/test_$name.py"
  fi
  case $name in
    opencl|vulkan)
      GPU_LIST="$GPU_LIST,$name"
      step "replay-tests-$name" 300 $PY -m pytest -x -q -p no:cacheprovider tests/test_replay.py -k "$name";;
    torch)  # the plugin's tests and its replay tests: on CUDA, the decode step captured as a CUDA graph
      step "replay-tests-torch" 300 $PY -m pytest -x -q -p no:cacheprovider tests/test_torch_replay.py \
        plugins/mnnllm-torch/tests;;
  esac
done
GPU_LIST=${GPU_LIST#,}

if [ -n "$GPU_LIST" ]; then
  step host-time 300 $PY bench/host_time.py -m "$MODEL" -a "cpu,$GPU_LIST" --replay off,on -n 32 -o json
fi

if [ "$QUICK" = 1 ]; then SIZES=(-p 64 -n 16 -rep 1); else SIZES=(-p 512 -n 128 -rep 3); fi
for name in $LIST; do
  step "bench-shared-$name" 300 .venv/bin/mnnllm bench -m "$MODEL" -a "$name" "${SIZES[@]}" -o json
done
if [ "$QUICK" != 1 ]; then
  step build-1.7b 300 $PY bench/model_scale.py --shapes 1.7b --build-only
  BIG=$(tail -n 1 "$OUT/build-1.7b.out" 2>/dev/null)
  if [ -f "$BIG" ]; then
    for name in $LIST; do
      step "bench-1.7b-$name" 300 .venv/bin/mnnllm bench -m "$BIG" -a "$name" -p 128 -n 32 -rep 2 -o json
    done
  fi
fi

$PY - "$OUT" "$(( $(date +%s) - started ))" <<'EOF' > "$OUT/summary.md"
"""summary.md from the folder's JSON: devices, conformance counts, host time, bench rows."""
import json
import sys
from pathlib import Path

out, seconds = Path(sys.argv[1]), sys.argv[2]


def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


print(f"# Device check ({seconds} s)\n\n| step | rc | s |\n|---|---:|---:|")
for line in (out / "steps.tsv").read_text().splitlines():
    print("| " + " | ".join(line.split("\t")) + " |")
backends = load("backends.out") or {"backends": []}
print("\n## Devices\n\n| backend | available | devices | reason |\n|---|---|---|---|")
for b in backends["backends"]:
    cells = [b["name"], str(b["available"]), "; ".join(b["devices"]), b["reason"]]
    print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
print("\n## Conformance (mnnllm test-backend)\n\n| backend | pass | fail | not supported |\n|---|---:|---:|---:|")
for path in sorted(out.glob("conformance-*.out")):
    data = load(path.name)
    rows = data if isinstance(data, list) else (data or {}).get("results", [])
    counts = {s: sum(1 for r in rows if r.get("status") == s) for s in ("pass", "fail", "unsupported")}
    print(f"| {path.stem.split('-', 1)[1]} | {counts['pass']} | {counts['fail']} | {counts['unsupported']} |")
host = load("host-time.out")
if host:
    print("\n## Host time per decode step (bench/host_time.py)\n")
    print("| backend | replay | forward ms | host ms | wait ms | host us/op | tok/s |\n|---|---|---:|---:|---:|---:|---:|")
    for r in host:
        if "error" not in r:
            print(f"| {r['backend']} | {r['replay']} | {r['forward_ms']:.2f} | {r['host_ms']:.2f} | "
                  f"{r['wait_ms']:.2f} | {r['host_us_per_op']:.1f} | {r['tok_s']:.1f} |")
print("\n## mnnllm bench\n\n| model | backend | device | test | tok/s | cold tok/s |\n|---|---|---|---|---:|---:|")
for path in sorted(out.glob("bench-*.out")):
    for r in load(path.name) or []:
        device = r["device"].replace("|", "/")
        print(f"| {Path(r['model']).parent.name} | {r['backend']} | {device} | {r['test']} | "
              f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {r.get('cold_ts', 0):.2f} |")
EOF
echo "device-check: wrote $OUT (summary.md)" >&2
! cut -f2 "$STATUS" | grep -qv '^0$'
