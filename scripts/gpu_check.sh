#!/usr/bin/env bash
# The GPU checks of graphfeed in one command, on a machine with an NVIDIA GPU, the CUDA toolkit and a CUDA
# torch (run from the repository root):  bash scripts/gpu_check.sh
#
#  1. builds the native ops with their CUDA kernels (graphfeed build-native, into $GRAPHFEED_CACHE_DIR);
#     meanwhile generates the `medium` graph and partitions it into 2 parts (--method random unless
#     pymetis is installed);
#  2. runs the GPU tests (tests/daemon/test_gpu_serving.py, tests/sampling/test_gpu_sampling.py, the CUDA parity tests,
#     tests/pyg/test_gpu.py: PyG's loaders over GPU daemons);
#  3. runs the GPU benches against the same runs on the CPU, on medium / 2 parts, batch 1024, fanout 15,10,5:
#     bench sample (CPU vs --device cuda, sampling only and with features), bench remote (CPU daemons vs
#     --server-device cuda), and the trainer's wait per batch with --trainer-device cuda, without and with
#     --pin-memory, behind a simulated 5 ms step;
#  4. prints every figure (one JSON line per run) and a summary; everything also goes to $OUT (or
#     /tmp/gpu_check) as log.txt and results.jsonl.
# Python packages the machine lacks can be carried as wheels in .whl/ (installed into /tmp/site first).
# Every step has its own time limit, so the script ends (within about 5 minutes) even when one hangs.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
LOG=$OUT/log.txt
RES=$OUT/results.jsonl
: >"$LOG"; : >"$RES"
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
say() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*"; }
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || say "wheel install failed"
fi
# graphfeed.* is this repository: a view folder whose graphfeed/ holds a link per package
VIEW=/tmp/gfview-gpucheck
rm -rf $VIEW; mkdir -p $VIEW/graphfeed
for init in "$ROOT"/*/__init__.py; do d=$(dirname "$init"); ln -s "$d" $VIEW/graphfeed/$(basename "$d"); done
export PYTHONPATH=$VIEW${PYTHONPATH:+:$PYTHONPATH}
export GRAPHFEED_CACHE_DIR=${GRAPHFEED_CACHE_DIR:-/tmp/gfcache-gpucheck}
export MAX_JOBS=${MAX_JOBS:-16}
GF="$PY -m graphfeed.cli"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY - <<'EOF'
import google.protobuf, grpc, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0),
      "| grpcio", grpc.__version__, "| protobuf", google.protobuf.__version__, "| cpus", __import__("os").cpu_count())
EOF
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST=$($PY -c "import torch; c=torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')" 2>/dev/null) \
    && export TORCH_CUDA_ARCH_LIST
fi

# ---- 1. build the CUDA ops; meanwhile the medium graph ---------------------------------------------------
G=${GRAPHS:-/tmp/gfgraphs-gpucheck}
METHOD=random
$PY -c "import pymetis" 2>/dev/null && METHOD=${GPU_CHECK_METHOD:-metis}
(
  set -e
  [ -f "$G/medium-p2/META.json" ] && exit 0
  $GF generate --preset medium --out "$G/medium" --skip-existing
  # through the API: the CLI asks for every server extra (pymetis) even for --method random
  $PY -c "import sys; from graphfeed.server.partition.inputs.reader import read_graph
from graphfeed.server.partition.build.builder import partition_graph
partition_graph(read_graph(sys.argv[1]), 2, sys.argv[2], method=sys.argv[3], topologies=('csc',))
print('partitioned', sys.argv[2], 'method', sys.argv[3])" "$G/medium" "$G/medium-p2" $METHOD
) >"$OUT/graph.log" 2>&1 &
GRAPH_PID=$!
say "building the native ops (TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-default}, MAX_JOBS=$MAX_JOBS)"
timeout 200 $GF build-native --force || say "build-native failed (exit $?)"
$PY -c "
from graphfeed import cuda_ext
from graphfeed.server.sampling.gpu import cuda_unavailable_reason
print('native ops:', cuda_ext.load_ops() is not None, '| CUDA kernels:', cuda_ext.has_cuda_kernels(),
      '| GPU sampling:', cuda_unavailable_reason() or 'available')"

# ---- 2. the GPU tests --------------------------------------------------------------------------------------
say "GPU tests"
timeout 200 $PY -m pytest -q --maxfail=5 -p no:cacheprovider --tb=short -rfEs tests/daemon/test_gpu_serving.py \
  tests/sampling/test_gpu_sampling.py tests/sampling/test_native_ops.py tests/sampling/test_native_typed.py \
  tests/pyg/test_gpu.py -k "gpu or cuda" >"$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|^E  " "$OUT/pytest.txt" | tail -30
say "GPU tests done"

# ---- 3. the benches on medium / 2 parts --------------------------------------------------------------------
say "waiting for the medium graph (method $METHOD)"
left=$(( 285 - ($(date +%s) - START) ))
if ! timeout $(( left > 10 ? left : 10 )) tail --pid=$GRAPH_PID -f /dev/null; then
  say "the medium graph was not ready in time: $(tail -3 "$OUT/graph.log")"; kill $GRAPH_PID 2>/dev/null
fi
wait $GRAPH_PID 2>/dev/null
cat "$OUT/graph.log" | tail -4
P=$G/medium-p2
ERRS=/tmp/gpu_check_errs; mkdir -p $ERRS
W=(--num-neighbors 15,10,5 --batch-size 1024 --epochs 1)
bench() {   # name, time limit, args...
  local name=$1 limit=$2; shift 2
  local left=$(( 320 - ($(date +%s) - START) ))
  if [ ! -f "$P/META.json" ] || [ $left -lt 15 ]; then say "skip $name (time left ${left}s)"; return; fi
  [ $limit -gt $left ] && limit=$left
  say "bench $name"
  local line
  line=$(timeout $limit $GF bench "$@" 2>"$ERRS/$name.err" | tail -1)
  if [ -n "$line" ]; then echo "{\"run\": \"$name\", \"result\": $line}" | tee -a "$RES"; else
    say "$name gave no result: $(tail -5 "$ERRS/$name.err")"; fi
}
# most telling first (a step that would not fit in the time left is skipped)
bench sample-cuda 40 sample --graph "$P" --device cuda "${W[@]}"
bench remote-gpu-daemons 60 remote --servers 2 --graph "$P" --server-device cuda "${W[@]}"
bench remote-cpu-daemons 70 remote --servers 2 --graph "$P" "${W[@]}"
bench remote-gpu-trainer-pageable 50 remote --servers 2 --graph "$P" --server-device cuda --trainer-device cuda \
  --step-ms 5 "${W[@]}"
bench remote-gpu-trainer-pinned 50 remote --servers 2 --graph "$P" --server-device cuda --trainer-device cuda \
  --pin-memory --step-ms 5 "${W[@]}"
bench sample-cpu 50 sample --graph "$P" "${W[@]}"
bench sample-cuda-features 40 sample --graph "$P" --device cuda --features --gpu-cache-mb 512 "${W[@]}"

# ---- 4. summary -----------------------------------------------------------------------------------------
$PY - "$RES" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = ("seeds_per_s", "sampled_edges_per_s", "cpu_s_per_epoch", "gpu_peak_mb", "wait_ms_per_batch", "gpu", "gpu_topology")
for r in rows:
    res = r["result"]
    print(f"{r['run']:32s}", "  ".join(f"{k}={res[k]}" for k in keys if res.get(k) is not None))
by = {r["run"]: r["result"] for r in rows}
def ratio(a, b):
    if a in by and b in by:
        print(f"{a} / {b}: {by[a]['seeds_per_s'] / max(by[b]['seeds_per_s'], 1e-9):.1f}x seeds/s")
ratio("sample-cuda", "sample-cpu"); ratio("remote-gpu-daemons", "remote-cpu-daemons")
EOF
say "done"
