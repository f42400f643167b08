#!/usr/bin/env bash
# The sparse experiments for a GPU call, from the repo root on the GPU machine (nothing to carry): builds
# sparse_spmv_bench there (nvcc, cudart static, the toolkit's or the wheel's libcusparse; ~1 min), then runs
#   --small       every-path ragged checks (all dtypes; split/segmented tails and slab kernels included)
#   --lsmr-block  LSMR's 16-RHS block iteration: N = 16 SpMM plans, cuSPARSE SpMM, k = 16 vector passes
#   --tails       the dispatched plan vs cuSPARSE on the cases below 0.9x, with the remaining candidates
#   --blocks      the row-blocks plan on the bundle-adjustment matrices vs cuSPARSE and the CSR plan
# Logs into OUT_DIR (default $OUT, else /tmp/spmv_experiments): one log per mode; summaries printed last.
# Usage: bash ffi_cuda/tools/run_spmv_experiments.sh [OUT_DIR] [MODES...]   (default modes: all four)
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${1:-${OUT:-/tmp/spmv_experiments}}
shift || true
MODES=${*:-small lsmr-block tails blocks}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
LIB=$(dirname "$(find / -name 'libcusparse.so.12*' -not -path '/proc/*' 2>/dev/null | head -1)")
FFI_INC=$("$PY" -c "import jax.ffi as f; print(f.include_dir())")
BIN=/tmp/spmv_bench_exp
t0=$(date +%s)
if ! nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -cudart static \
    -I "$REPO/ffi_cuda" -isystem "$FFI_INC" "$REPO/ffi_cuda/tools/sparse_spmv_bench.cu" -o "$BIN" \
    -L "$LIB" -l:libcusparse.so.12 >"$OUTDIR/build_spmv.log" 2>&1; then
  tail -20 "$OUTDIR/build_spmv.log"
  echo "sparse_spmv_bench build FAILED"
  exit 1
fi
rm -f "$OUTDIR/build_spmv.log"
echo "sparse_spmv_bench built ($(($(date +%s) - t0)) s); libcusparse from $LIB"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
for mode in $MODES; do
  t0=$(date +%s)
  timeout 300 "$BIN" "--$mode" >"$OUTDIR/$mode.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "=== --$mode rc=$rc ($(($(date +%s) - t0)) s)"
  grep -E "FAIL|failures" "$OUTDIR/$mode.log" | head -20
  sed -n '/summary/,$p' "$OUTDIR/$mode.log" | cut -c1-200 | head -60
done
exit $status
