#!/usr/bin/env bash
# Set up a bare device machine and run a command there: bench/device.sh CMD...
# Carries: .whl/ (xdsl, optuna and their dependencies) and, if present, .devcache/tune.sqlite (the tuning cache
# of earlier runs). The cache is copied back to $OUT/tune.sqlite at the end.
# With $OUT set, every run first measures the card's ceilings (bench/ceilings.py: copy bandwidth, bf16 matmul
# rate) into $OUT/ceilings.json (CEILINGS=0 skips it).
# GPU_TESTS=1 also runs the GPU tests (`pytest -m gpu`) before CMD and saves their log, headed by the card,
# the commit and the versions, to $OUT/gpu-tests.log: copy it to bench/results/<date>-<card>-gpu-tests.log
# with the run's other results. Their exit status is in the log's last line; CMD runs either way.
# GPU_TESTS_WORKERS=N runs them in N pytest-xdist processes sharing the card (most of a GPU test's time is
# compiling on the host; one process takes longer than a call's 600 s on a slow host).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DLBLAS_CACHE_DIR=/tmp/dlblas_cache
mkdir -p $DLBLAS_CACHE_DIR
[ -f .devcache/tune.sqlite ] && cp .devcache/tune.sqlite $DLBLAS_CACHE_DIR/
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -n "$OUT" ] && [ "${CEILINGS:-1}" != 0 ]; then
  python3 bench/ceilings.py "$OUT" || echo "ceilings: measurement failed"
fi
if [ "${GPU_TESTS:-0}" = 1 ]; then
  log=${OUT:-.}/gpu-tests.log
  {
    echo "# GPU tests: python3 -m pytest -q -p no:cacheprovider -m gpu tests (${GPU_TESTS_WORKERS:-1} processes)"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# card: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    echo "# commit: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with uncommitted changes)')"
    echo "# versions: $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1)"
  } > "$log"
  workers=${GPU_TESTS_WORKERS:-1}
  [ "$workers" -gt 1 ] && xdist="-n $workers" || xdist=
  python3 -m pytest -q -p no:cacheprovider -m gpu -rs $xdist tests 2>&1 | tee -a "$log"
  echo "# pytest exit status: ${PIPESTATUS[0]}" | tee -a "$log"
fi
rc=0
[ $# -gt 0 ] && { "$@"; rc=$?; }
[ -n "$OUT" ] && [ -f $DLBLAS_CACHE_DIR/tune.sqlite ] && python3 -c "
import sqlite3, sys
src = sqlite3.connect('$DLBLAS_CACHE_DIR/tune.sqlite'); dst = sqlite3.connect('$OUT/tune.sqlite')
src.backup(dst); dst.close()"
exit $rc
