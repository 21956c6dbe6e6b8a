#!/bin/bash
# run64: the final build of the session on the GPU: the GPU tests, and the paths bench with the
# layers priming (Planner::prime now says whether it planned; the layer counts only those).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
W=/tmp/run64; mkdir -p $W
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $W/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|Failure|PASSED" $W/gpu_tests.log | head -20
t=$(date +%s)
timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-steps 12 --out $W/paths-qwen3-235b.json > $W/paths-qwen3-235b.log 2>&1
echo "paths rc=$? in $(( $(date +%s) - t )) s"
grep -E "plans: median|rank 0 planned" $W/paths-qwen3-235b.log | sed -E 's/ +/ /g'
tar -czf $OUT/b.tar.gz -C $W .
