#!/bin/bash
# run54: the GPU tests after the time budget's blends changed order (the default's plans differ on
# the steps whose blends keep out of order), then `feplb run` on the bundled trace.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
mkdir -p $OUT/b
t=$(date +%s)
$B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_tests.log
grep -E "FAILED|Failure" $OUT/b/gpu_tests.log | head -5
t=$(date +%s)
$B/bin/feplb_gpu_mp_tests > $OUT/b/gpu_mp_tests.log 2>&1; echo "gpu_mp_tests rc=$? in $(( $(date +%s) - t )) s"; grep -E "PASSED|SKIPPED \]|FAILED" $OUT/b/gpu_mp_tests.log | tail -n 3
t=$(date +%s)
timeout 150 $B/bin/feplb run --trace data/traces/default.json --cost-model data/cost/h200-glm5.json --steps 8 \
  --json $OUT/b/run.json --force > $OUT/b/run.log 2>&1; echo "feplb run rc=$? in $(( $(date +%s) - t )) s"; tail -n 15 $OUT/b/run.log
