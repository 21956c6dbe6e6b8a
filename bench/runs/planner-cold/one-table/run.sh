#!/bin/bash
F='^plan(_cold|_primed)?/feplb/(ep8_e128_skew5|ep72_e288|ep256)'
for r in 1 2 3 4 5; do
  for v in base new; do
    if [ $v = base ]; then B=/tmp/exp/build/bin/feplb_cpu_bench; else B=/work/main/build/bin/feplb_cpu_bench; fi
    taskset -c 1 $B --benchmark_filter="$F" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_format=json > $v$r.json 2> $v$r.err
  done
done
echo done > DONE
