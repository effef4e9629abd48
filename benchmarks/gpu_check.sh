#!/usr/bin/env bash
# The GPU check, prepared to run once on a machine with one CUDA GPU and no network
# (e.g. one H200, 16 cores, torch 2.11 on Python 3.12 already installed), in under 6 minutes:
#   1. install what Python cannot import from shared/wheels (benchmarks/gpu_wheels.sh
#      fetches them where the network is), into a private folder, without the network;
#   2. tests/runtime/test_cuda.py;
#   3. benchmarks/gpu_check.py: capture, profile and run gpu-preset workloads on cuda+host
#      at 2 budgets with synchronous, asynchronous, lru, save_on_cpu and all-fast, each
#      checked against eager PyTorch on the GPU; a table and Figure 12.
# Everything goes to one folder, OUT (default: ./gpu_check_out), at most 8 files:
#   env.txt, pytest.log, gpu_check.log, gpu_check.jsonl (every field of every run),
#   gpu.jsonl (autotm.results records: `autotm plot gpu --out OUT` reads them), table.txt,
#   fig12-gpu-gpu-cuda-host.png and .svg (or figure12.png if autotm.plots fails).
#
#   bash benchmarks/gpu_check.sh [OUT]
# Knobs (environment): PYTHON, SWEEP_DEADLINE (seconds after which no new run starts),
# WORKLOADS, RATIOS, GPU_CHECK_ARGS (more gpu_check.py options).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-./gpu_check_out}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8   # deterministic cuBLAS: must be set before CUDA starts
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }

# ---- 1. dependencies (no network: wheels carried in shared/wheels)
missing=()
for mod_pkg in highspy:highspy typer:typer rich:rich platformdirs:platformdirs numpy:numpy \
               matplotlib:matplotlib hypothesis:hypothesis pytest:pytest pytest_timeout:pytest-timeout; do
    mod=${mod_pkg%%:*}; pkg=${mod_pkg#*:}
    "$PY" -c "import $mod" 2>/dev/null || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "missing: ${missing[*]}"
    if [ -d shared/wheels ]; then
        SITE=/tmp/autotm-site
        # --no-deps: only what is missing, so the image's own numpy, torch etc. stay in charge
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
            --find-links shared/wheels "${missing[@]}" || echo "WARNING: installing from shared/wheels failed"
        export PYTHONPATH="$PYTHONPATH:$SITE"
    else
        echo "WARNING: no shared/wheels folder (run benchmarks/gpu_wheels.sh where the network is)"
    fi
fi
{
    echo "date: $(date -u)"; uname -a; "$PY" --version
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
    "$PY" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory, "bytes")
for m in ("highspy", "typer", "rich", "platformdirs", "numpy", "matplotlib", "hypothesis", "pytest"):
    try:
        mod = __import__(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "MISSING", e)
import autotm.tiers.cuda_tier  # noqa: F401
print("autotm imports")
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# ---- 2. the CUDA tests
echo "== tests/runtime/test_cuda.py (t=$(elapsed) s)"
timeout 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/runtime/test_cuda.py > "$OUT/pytest.log" 2>&1
echo "pytest exit $? (124: timed out)" >> "$OUT/pytest.log"
tail -25 "$OUT/pytest.log"

# ---- 3. the sweep: no new run after SWEEP_DEADLINE seconds, killed at 6 min - what was used
left=$(( 345 - $(elapsed) ))
[ "$left" -lt 60 ] && left=60
deadline=${SWEEP_DEADLINE:-$(( left > 90 ? left - 75 : 15 ))}
echo "== gpu_check.py (t=$(elapsed) s, deadline ${deadline} s, hard limit ${left} s)"
timeout --signal=INT --kill-after=10 "$left" "$PY" benchmarks/gpu_check.py --out "$OUT" \
    --workloads "${WORKLOADS:-vgg19@64,resnet50@64,transformer@16}" --ratios "${RATIOS:-1:2,1:1}" \
    --iterations 3 --verify-iterations 2 --time-limit 20 --deadline "$deadline" \
    --cache /tmp/autotm-gpu-profile.sqlite ${GPU_CHECK_ARGS:-} 2>&1 | tee "$OUT/gpu_check.log"
echo "gpu_check exit ${PIPESTATUS[0]} after $(elapsed) s (124: timed out)" | tee -a "$OUT/gpu_check.log"
ls -la "$OUT"
