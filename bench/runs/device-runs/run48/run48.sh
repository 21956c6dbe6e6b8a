#!/bin/bash
# run48: GPU + mp tests after the chooser's pooled, every-micro-batch exploration and one-hop
# time candidates up to 288 GPUs; the feplb planner benchmark and the full modes report on the
# host CPU (one pinned core each, run side by side on different cores).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
mkdir -p $OUT/check
start=$(date +%s)
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
( timeout 540 taskset -c 3 $B/bin/feplb report --modes --md $OUT/modes-h200host.md --json $OUT/modes-h200host.json --force > $OUT/modes.log 2>&1; echo "modes rc=$?" >> $OUT/modes.log ) &
modes_pid=$!
( taskset -c 2 $B/bin/feplb_cpu_bench --benchmark_filter='plan/feplb(\+.*|-rows)?/' --benchmark_out=$OUT/cpu-planners-feplb-h200host.json --benchmark_out_format=json --benchmark_context=pinned=cpu2 --benchmark_context=host=h200 > $OUT/bench.log 2>&1; echo "bench rc=$?" >> $OUT/bench.log ) &
bench_pid=$!
OUT=$OUT/check timeout 330 bash $B/gpu-check > $OUT/check/check.log 2>&1; echo "gpu-check rc=$? in $(( $(date +%s) - start )) s"
grep -E "PASSED|FAILED|tests ran" $OUT/check/check.log | head -12
grep -E "FAILED" $OUT/check/gpu_tests.log | head -20
rm -f $OUT/check/gpu_tests.json $OUT/check/gpu_mp_tests.json $OUT/check/gpu_tests.log
wait $bench_pid; tail -1 $OUT/bench.log
grep -E "_median" $OUT/bench.log | awk '{print $1, $2, $3}'
wait $modes_pid; tail -1 $OUT/modes.log
echo "met: $(grep -c '| \*\*yes\*\* |' $OUT/modes-h200host.md)"
grep -E "^\| [0-9]+ \|" $OUT/modes-h200host.md | grep "no (" | cut -c1-260
echo "total $(( $(date +%s) - start )) s"
