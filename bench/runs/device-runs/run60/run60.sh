#!/bin/bash
# run60: the GPU tests (one hop planned from the previous micro-batch and refined, one_hop_refine
# = 1, added to the layer's path tests), the paths bench with that mode beside the others and the
# default, and `feplb run` of the default (its start-up planner times and first mode printed), and the default
# planner's time on the host CPU.
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
export CUDA_DEVICE_MAX_CONNECTIONS=32  # virtual ranks
mkdir -p $OUT/b
t=$(date +%s)
timeout 200 $B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"
grep -E "FAILED|Failure|PASSED" $OUT/b/gpu_tests.log | head -20
for shape in qwen3-235b qwen3-30b; do
  t=$(date +%s)
  timeout 100 $B/bin/feplb_gpu_bench --sections paths --paths-shape $shape --paths-steps 12 --out $OUT/b/paths-$shape.json > $OUT/b/paths-$shape.log 2>&1
  echo "paths $shape rc=$? in $(( $(date +%s) - t )) s"
  tail -n 9 $OUT/b/paths-$shape.log
done
mkdir -p /tmp/runs
t=$(date +%s)
timeout 120 $B/bin/feplb run --policies feplb --steps 32 --json /tmp/runs/run_measured.json > /tmp/runs/run_measured.log 2>&1
echo "feplb run rc=$? in $(( $(date +%s) - t )) s"
grep -E "two-phase plans|modes of|measured at start|^feplb  " /tmp/runs/run_measured.log
cp /tmp/runs/run_measured.* $OUT/b/
# The default planner's time on the host CPU at the three target workloads, one pinned core, two
# rounds (the host's speed drifts).
grep -E "Model name|^CPU\(s\)|Hypervisor" <(lscpu)
F='plan/feplb/(ep8_e128_skew5|ep72_e288|ep256)'
for run in 1 2; do
  t=$(date +%s)
  LD_LIBRARY_PATH=$PWD/$B/lib taskset -c 2 timeout 150 $B/bin/feplb_cpu_bench --benchmark_filter="$F" --benchmark_repetitions=5 --benchmark_out=$OUT/b/round$run.json --benchmark_out_format=json > $OUT/b/round$run.log 2>&1
  echo "round $run rc=$? in $(( $(date +%s) - t )) s"
  python3 -c "
import json; d=json.load(open('$OUT/b/round$run.json'))
for b in d['benchmarks']:
  if b.get('aggregate_name')=='median': print('  ', b['run_name'].split('/')[-2], 'median', round(b['real_time'],1), 'p99', round(b.get('p99_us',0),1), 'reserve', round(b.get('reserve_us',0),1))
"
done
