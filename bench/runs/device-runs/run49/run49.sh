#!/bin/bash
# run49: on the H200 machine's host CPU, one pinned core each, one after the other, nothing else
# running: the feplb planner benchmark (now with the plans' own reserve, p95 and the machine's
# stalls beside p99), then the modes report (56 workloads, EP=64 as 8x8 among them).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
mkdir -p $OUT/b
lscpu | grep -E "Model name|^CPU\(s\)|MHz|Hypervisor" > $OUT/b/host-cpu.txt; cat $OUT/b/host-cpu.txt
t=$(date +%s)
taskset -c 2 $B/bin/feplb_cpu_bench --benchmark_filter='plan/feplb(\+.*|-rows)?/' --benchmark_out=$OUT/b/cpu-planners-feplb-h200host.json --benchmark_out_format=json --benchmark_context=pinned=cpu2 --benchmark_context=host=h200 > $OUT/b/bench.log 2>&1; echo "bench rc=$? in $(( $(date +%s) - t )) s"
grep -E "_median" $OUT/b/bench.log | awk '{print $1, $2, $3}'
t=$(date +%s)
timeout 420 taskset -c 3 $B/bin/feplb report --modes --md $OUT/b/modes-h200host.md --json $OUT/b/modes-h200host.json --force > $OUT/b/modes.log 2>&1; echo "modes rc=$? in $(( $(date +%s) - t )) s"
echo "met: $(grep -c '| \*\*yes\*\* |' $OUT/b/modes-h200host.md)"
grep -E "^\| [0-9]+ \|" $OUT/b/modes-h200host.md | grep "no (" | cut -c1-260
