#!/bin/bash
# run60: the default planner's time on the H200 machine's host CPU at the current planner (the
# receiver tree's depth-first search, the chooser costing its modes at the host's speed):
# Google Benchmark's default cases, pinned to one core, three rounds on cores 2, 5 and 9.
set -u
B=.devbundle
mkdir -p $OUT/b
lscpu | grep -E "Model name|^CPU\(s\)|MHz|Hypervisor" > $OUT/b/lscpu.txt
F='plan/feplb/'
for round in 1 2 3; do
  c=$(( round == 1 ? 2 : round == 2 ? 5 : 9 ))
  t=$(date +%s)
  LD_LIBRARY_PATH=$PWD/$B/lib taskset -c $c $B/bin/feplb_cpu_bench --benchmark_filter="$F" \
    --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out=$OUT/b/round$round.json --benchmark_out_format=json > $OUT/b/round$round.log 2>&1
  echo "round $round core $c rc=$? in $(( $(date +%s) - t )) s"
  grep median $OUT/b/round$round.log | awk '{print $1, $2, $3}'
done
