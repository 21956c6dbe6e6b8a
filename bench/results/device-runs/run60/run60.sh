#!/bin/bash
# run60: the GPU tests (one hop planned from the previous micro-batch and refined, one_hop_refine
# = 1, added to the layer's path tests), the paths bench with that mode beside the others and the
# default, and `feplb run` of the default (its start-up planner times and first mode printed).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
mkdir -p $OUT/b
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|Failure|PASSED" $OUT/b/gpu_tests.log | head -20
for shape in qwen3-235b qwen3-30b; do
  t=$(date +%s)
  timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-shape $shape --paths-steps 12 --out $OUT/b/paths-$shape.json > $OUT/b/paths-$shape.log 2>&1
  echo "paths $shape rc=$? in $(( $(date +%s) - t )) s"
  tail -n 9 $OUT/b/paths-$shape.log
done
mkdir -p /tmp/runs
t=$(date +%s)
timeout 120 $B/bin/feplb run --policies feplb --steps 32 --json /tmp/runs/run_measured.json > /tmp/runs/run_measured.log 2>&1
echo "feplb run rc=$? in $(( $(date +%s) - t )) s"
grep -E "two-phase plans|modes of|measured at start|^feplb  " /tmp/runs/run_measured.log
cp /tmp/runs/run_measured.* $OUT/b/
# (The planner benchmark on the host CPU was planned here too; it was dropped to fit the device
# time left: its last measurement is run55's.)
