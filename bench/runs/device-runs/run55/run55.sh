#!/bin/bash
# run55: the GPU tests after the default's two-phase reserve change (0.125 us per expert and per
# GPU), then the default feplb planner's time on the H200 machine's host CPU at the three target
# workloads (lognormal skew 5: EP=8/E=128, EP=72/E=288 and EP=256/E=1024 in one domain) and the
# one-hop time workloads at EP=64, on one pinned core, three rounds (the host's speed drifts).
set -u
B=.devbundle
export FEPLB_DATA_DIR=$PWD/data
mkdir -p $OUT/b
t=$(date +%s)
$B/bin/feplb_gpu_tests > $OUT/b/gpu_tests.log 2>&1; echo "gpu_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_tests.log
t=$(date +%s)
$B/bin/feplb_gpu_mp_tests > $OUT/b/gpu_mp_tests.log 2>&1; echo "gpu_mp_tests rc=$? in $(( $(date +%s) - t )) s"; tail -n 3 $OUT/b/gpu_mp_tests.log
grep -E "Model name|^CPU\(s\)|Hypervisor" <(lscpu)
F='plan/feplb/(ep8_e128_skew5|ep72_e288|ep256|ep64_e128_olmoe|ep64_e256/)'
for run in 1 2 3; do
  t=$(date +%s)
  LD_LIBRARY_PATH=$PWD/$B/lib taskset -c 2 $B/bin/feplb_cpu_bench --benchmark_filter="$F" --benchmark_out=$OUT/b/round$run.json --benchmark_out_format=json > $OUT/b/round$run.log 2>&1
  echo "round $run rc=$? in $(( $(date +%s) - t )) s"
  python3 -c "
import json; d=json.load(open('$OUT/b/round$run.json'))
for b in d['benchmarks']:
  if b.get('aggregate_name')=='median': print('  ', b['run_name'].split('/')[-2], 'median', round(b['real_time'],1), 'p50', round(b.get('p50_us',0),1), 'p95', round(b.get('p95_us',0),1), 'p99', round(b.get('p99_us',0),1), 'reserve', round(b.get('reserve_us',0),1), 'stalls/s', round(b.get('stalls_per_s',0)), 'stall p50', round(b.get('stall_p50_us',0),1))
"
done
