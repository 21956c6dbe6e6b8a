#!/bin/bash
# run66: the current build (the branch-free planner choices) end to end on a GPU machine:
#  1. the GPU tests;
#  2. the paths bench with the default (`auto`) among the paths;
#  3. the hot planner benchmark on the host CPU (plan/feplb/..., 5 repetitions, one pinned core);
#  4. feplb.torch's tests (Megatron-Core at the pinned commit in .megatron-lm) and the grouped_mm
#     comparison (scripts/gpu-torch).
# Key lines are printed as they come; everything into $OUT/b.tar.gz after each step.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
W=/tmp/run66; mkdir -p $W/torch
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
grep -E "Model name|^CPU\(s\)" <(lscpu)
cat $B/commit
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $W/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|Failure|PASSED" $W/gpu_tests.log | head -20
t=$(date +%s)
timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-steps 12 --out $W/paths-qwen3-235b.json > $W/paths-qwen3-235b.log 2>&1
echo "paths rc=$? in $(( $(date +%s) - t )) s"
grep -E "plans: median|rank 0 planned" $W/paths-qwen3-235b.log | sed -E 's/ +/ /g'
tar -czf $OUT/b.tar.gz -C $W .
t=$(date +%s)
LD_LIBRARY_PATH=$PWD/$B/lib taskset -c 2 timeout 120 $B/bin/feplb_cpu_bench --benchmark_filter='^plan/feplb/(ep8_e128_skew5|ep72_e288|ep256)' --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_out=$W/hot.json --benchmark_out_format=json > $W/hot.log 2>&1
echo "cpu bench rc=$? in $(( $(date +%s) - t )) s"
grep -E "median|p99" $W/hot.log | sed -E 's/ +/ /g' | cut -c1-200
tar -czf $OUT/b.tar.gz -C $W .
t=$(date +%s)
OUT=$W/torch timeout 250 bash scripts/gpu-torch tests grouped_mm > $W/torch.log 2>&1
echo "gpu-torch rc=$? in $(( $(date +%s) - t )) s"
tail -5 $W/torch.log
cat $W/torch/summary.txt 2>/dev/null | tail -40
tar -czf $OUT/b.tar.gz -C $W .
