#!/bin/bash
# run65: the branch-free planner choices (bench/results/planner-branches/) on a GPU machine's host:
#  1. the GPU tests on this build;
#  2. the in-process A/B (ab_main: 234bb5e's core against this build's, each in a link namespace of
#     its own, 100 rounds of 64 plans each in turn, one pinned core), and the build against itself;
#  3. the hot planner benchmark of this build (plan/feplb/..., 5 repetitions).
# .devbundle/ab is made by hand (see README.md). Everything into $OUT/b.tar.gz.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32
W=/tmp/run65; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader; grep -E "Model name" <(lscpu)
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $W/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|PASSED" $W/gpu_tests.log | head -20
A=$B/ab
for cfg in "8 128 8" "72 288 72" "256 1024 256"; do
  set -- $cfg
  echo "B against A:  $(taskset -c 2 timeout 120 $A/ab_main $A/A/side.so $A/B/side.so $1 $2 5 $3 100 64)" | tee -a $W/ab.txt
  echo "A against A:  $(taskset -c 2 timeout 120 $A/ab_main $A/A/side.so $A/A/side2.so $1 $2 5 $3 100 64)" | tee -a $W/ab.txt
done
t=$(date +%s)
LD_LIBRARY_PATH=$PWD/$B/lib taskset -c 2 timeout 150 $B/bin/feplb_cpu_bench --benchmark_filter='^plan/feplb/(ep8_e128_skew5|ep72_e288|ep256)' --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_out=$W/hot.json --benchmark_out_format=json > $W/hot.log 2>&1
echo "cpu bench rc=$? in $(( $(date +%s) - t )) s"
grep median $W/hot.log | sed -E 's/ +/ /g' | cut -c1-200
tar -czf $OUT/b.tar.gz -C $W .
