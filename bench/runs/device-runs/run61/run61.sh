#!/bin/bash
# run61: the paths bench again after its fix (the default's layer was not given prefetch() calls,
# so it could not prefetch), now recording rank 0's plans by mode and the planner times measured
# at start; both expert shapes.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
mkdir -p $OUT/b
for shape in qwen3-235b qwen3-30b; do
  t=$(date +%s)
  timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-shape $shape --paths-steps 12 --out $OUT/b/paths-$shape.json > $OUT/b/paths-$shape.log 2>&1
  echo "paths $shape rc=$? in $(( $(date +%s) - t )) s"
  tail -n 12 $OUT/b/paths-$shape.log
done
