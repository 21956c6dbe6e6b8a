#!/bin/bash
# run52: on the H200 machine's host CPU, one pinned core, nothing else running: the default feplb
# planner before (3e79f0b) and after (bf26040) the receiver tree's least-loaded answer and the
# schedule writer's slices in plan order, interleaved twice on the three target workloads
# (lognormal skew 5: EP=8/E=128, EP=72/E=288 and EP=256/E=1024 in one domain), then the full
# feplb planner benchmark of the new build.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
mkdir -p $OUT/b
lscpu | grep -E "Model name|^CPU\(s\)|MHz|Hypervisor" > $OUT/b/host-cpu.txt; cat $OUT/b/host-cpu.txt
F='plan/feplb/(ep8_e128_skew5|ep72_e288|ep256)'
for r in 1 2; do
  for v in old new; do
    if [ $v = old ]; then bin=$B/old/bin/feplb_cpu_bench; lp=$PWD/$B/old/lib:$PWD/$B/lib; else bin=$B/bin/feplb_cpu_bench; lp=$PWD/$B/lib; fi
    t=$(date +%s)
    LD_LIBRARY_PATH=$lp taskset -c 2 $bin --benchmark_filter="$F" --benchmark_out=$OUT/b/ab-$v-$r.json --benchmark_out_format=json > $OUT/b/ab-$v-$r.log 2>&1
    echo "ab $v $r rc=$? in $(( $(date +%s) - t )) s"
    grep -E "_median" $OUT/b/ab-$v-$r.log | awk '{print $1, $2, $3}'
  done
done
t=$(date +%s)
LD_LIBRARY_PATH=$PWD/$B/lib taskset -c 2 $B/bin/feplb_cpu_bench --benchmark_filter='plan/feplb(\+.*|-rows)?/' --benchmark_out=$OUT/b/cpu-planners-feplb-h200host.json --benchmark_out_format=json --benchmark_context=pinned=cpu2 --benchmark_context=host=h200 > $OUT/b/bench.log 2>&1; echo "bench rc=$? in $(( $(date +%s) - t )) s"
grep -E "_median" $OUT/b/bench.log | awk '{print $1, $2, $3}'
