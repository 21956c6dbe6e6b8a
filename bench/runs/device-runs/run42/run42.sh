#!/bin/bash
# run42: GPU + mp tests with the chooser's all-tries time candidates, then the feplb planner
# benchmark on the host CPU (one pinned core).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
mkdir -p $OUT/check
start=$(date +%s)
OUT=$OUT/check timeout 330 bash $B/gpu-check > $OUT/check/check.log 2>&1; echo "gpu-check rc=$? in $(( $(date +%s) - start )) s"
grep -E "PASSED|FAILED|tests ran" $OUT/check/check.log | head -12
grep -E "FAILED" $OUT/check/gpu_tests.log | head -20
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
t=$(date +%s)
taskset -c 2 $B/bin/feplb_cpu_bench --benchmark_filter='plan/feplb(\+.*|-rows)?/' --benchmark_out=$OUT/cpu-planners-feplb-h200host.json --benchmark_out_format=json --benchmark_context=pinned=cpu2 --benchmark_context=host=h200 > $OUT/bench.log 2>&1; echo "bench rc=$? in $(( $(date +%s) - t )) s"
grep -E "_median" $OUT/bench.log | awk '{print $1, $2, $3}'
rm -f $OUT/check/gpu_tests.json $OUT/check/gpu_mp_tests.json
echo "total $(( $(date +%s) - start )) s"
