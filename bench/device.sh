#!/usr/bin/env bash
# Set up a bare device machine and run a command there: bench/device.sh CMD...
# Carries: .whl/ (xdsl, optuna and their dependencies) and, if present, .devcache/tune.sqlite (the tuning cache
# of earlier runs). The cache is copied back to $OUT/tune.sqlite at the end.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DLBLAS_CACHE_DIR=/tmp/dlblas_cache
mkdir -p $DLBLAS_CACHE_DIR
[ -f .devcache/tune.sqlite ] && cp .devcache/tune.sqlite $DLBLAS_CACHE_DIR/
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
"$@"
rc=$?
[ -n "$OUT" ] && [ -f $DLBLAS_CACHE_DIR/tune.sqlite ] && python3 -c "
import sqlite3, sys
src = sqlite3.connect('$DLBLAS_CACHE_DIR/tune.sqlite'); dst = sqlite3.connect('$OUT/tune.sqlite')
src.backup(dst); dst.close()"
exit $rc
