#!/bin/bash
# run41: GPU + mp tests at HEAD (chooser warm-up fix), then on the host CPU: the feplb planner
# benchmark (one pinned core) beside the modes report (another core).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
mkdir -p $OUT/check
start=$(date +%s)
OUT=$OUT/check timeout 330 bash $B/gpu-check > $OUT/check/check.log 2>&1; echo "gpu-check rc=$? in $(( $(date +%s) - start )) s"
grep -E "PASSED|FAILED|tests ran" $OUT/check/check.log | head -12
lscpu | grep -E "Model name|^CPU\(s\)|MHz" > $OUT/host-cpu.txt; cat $OUT/host-cpu.txt
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
t=$(date +%s)
( taskset -c 4 $B/bin/feplb report --modes --md $OUT/modes-h200host.md --json $OUT/modes-h200host.json --force > $OUT/modes.log 2>&1; echo "modes rc=$? in $(( $(date +%s) - t )) s" >> $OUT/modes.log ) &
taskset -c 2 $B/bin/feplb_cpu_bench --benchmark_filter='plan/feplb(\+.*|-rows)?/' --benchmark_out=$OUT/cpu-planners-feplb-h200host.json --benchmark_out_format=json --benchmark_context=pinned=cpu2 --benchmark_context=host=h200 > $OUT/bench.log 2>&1; echo "bench rc=$? in $(( $(date +%s) - t )) s"
grep -E "^plan/" $OUT/bench.log | head -40
wait
tail -2 $OUT/modes.log; grep -c '| \*\*yes\*\* |' $OUT/modes-h200host.md
echo "total $(( $(date +%s) - start )) s"
