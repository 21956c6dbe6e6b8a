#!/bin/bash
# run43: GPU + mp tests with the chooser's blends-alone time candidates beyond 16 GPUs and exploring with the step's prefetched weights,
# then the feplb planner benchmark on the host CPU (one pinned core) and the modes report's rack workloads there.
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
t=$(date +%s)
timeout 200 taskset -c 3 $B/bin/feplb report --modes --workloads "4 experts per GPU, EP=" --md $OUT/modes-rack-h200host.md --json $OUT/modes-rack-h200host.json --force > $OUT/modes.log 2>&1; echo "modes rc=$? in $(( $(date +%s) - t )) s"
grep -E "^\| [0-9]+ \|" $OUT/modes-rack-h200host.md | head -8 | cut -c1-260
echo "total $(( $(date +%s) - start )) s"
