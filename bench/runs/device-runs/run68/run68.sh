#!/bin/bash
# run68: the chooser with two-phase late-copy candidates over several small domains, and the GPU
# layer test of that path (`prefetch_late`: two phases, prefetch, copy_timing 3):
#  1. the GPU tests;
#  2. the paths bench with the default among the paths.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
W=/tmp/run68; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; cat $B/commit
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $W/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|Failure|PASSED|prefetch_late" $W/gpu_tests.log | head -30
tar -czf $OUT/b.tar.gz -C $W .
t=$(date +%s)
timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-steps 12 --out $W/paths-qwen3-235b.json > $W/paths-qwen3-235b.log 2>&1
echo "paths rc=$? in $(( $(date +%s) - t )) s"
grep -E "copy wait|rank 0 planned" $W/paths-qwen3-235b.log | sed -E 's/ +/ /g' | cut -c1-160
tar -czf $OUT/b.tar.gz -C $W .
